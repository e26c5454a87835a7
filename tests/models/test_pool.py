"""model.conv_impl's max pooling: each plain nn.MaxPool2d the app swaps for trainkit's kernel (KernelMaxPool2d)
computes what MindSpore's own computes, forward and backward (the kernel itself is tested against NumPy in
tests/kernels/test_max_pool.py), and what the kernel does not compute is left alone."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from omegaconf import OmegaConf

from trainkit import kernels
from trainkit.app import build
from trainkit.models.conv import UnfoldConv2d
from trainkit.models.conv_swap import swap_max_pools
from trainkit.models.pool import KernelMaxPool2d

pytestmark = pytest.mark.skipif(kernels.library()[0] is None, reason="trainkit's kernels do not build here")

SWAPPED = [  # nn.MaxPool2d's arguments
    dict(kernel_size=3, stride=2, pad_mode="pad", padding=1),  # torchvision ResNet's
    dict(kernel_size=(3, 2), stride=(2, 1), pad_mode="pad", padding=(1, 0), dilation=(1, 2)),
    dict(kernel_size=2, stride=2),  # pad_mode="valid", ops.MaxPool
    dict(kernel_size=3, stride=1, pad_mode="valid"),
]
KEPT = [
    dict(kernel_size=3, stride=2, pad_mode="pad", padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, pad_mode="pad", padding=1, return_indices=True),
    dict(kernel_size=3, stride=2, pad_mode="same"),
]


def _forward_and_gradient(pool: nn.Cell, x: Tensor, upstream: Tensor):
    loss = lambda value: (pool(value) * upstream).sum()  # noqa: E731
    return pool(x).asnumpy(), ops.grad(loss)(x).asnumpy()


@pytest.mark.parametrize("arguments", SWAPPED, ids=str)
def test_a_swapped_max_pool_computes_what_nn_max_pool2d_computes_forward_and_backward(mode, arguments):
    """The same maxima bit for bit, and each gradient at the same (first) maximum of a window with ties (half the
    input is a ReLU's zeros); where windows overlap, MindSpore's gradient adds them in another order (float32
    rounding).

    Mutation caught: max_pool_geometry reading the padding of a pad_mode="pad" pooling as 0 (`(ph, pw) = (0, 0)`)
    fails ResNet's case (other output shape)."""
    rng = np.random.default_rng(len(str(arguments)))
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    x[:, :, 1::2] = np.maximum(x[:, :, 1::2], 0)
    network = nn.SequentialCell([nn.MaxPool2d(**arguments)])
    native_y = network(Tensor(x)).asnumpy()
    upstream = Tensor(rng.standard_normal(native_y.shape).astype(np.float32))
    native = _forward_and_gradient(network, Tensor(x), upstream)
    assert swap_max_pools(network, "auto") == 1
    assert type(network[0]) is KernelMaxPool2d
    (y, dx), (native_y, native_dx) = _forward_and_gradient(network, Tensor(x), upstream), native
    np.testing.assert_array_equal(y, native_y)
    np.testing.assert_allclose(dx, native_dx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arguments", KEPT, ids=str)
def test_what_the_kernel_does_not_compute_keeps_nn_max_pool2d(arguments):
    network = nn.SequentialCell([nn.MaxPool2d(**arguments)])
    assert swap_max_pools(network, "auto") == 0
    assert type(network[0]) is nn.MaxPool2d


class PoolNet(nn.Cell):
    """A ported network's stem: convolution, ReLU, max pooling, then a head."""

    def __init__(self, num_classes: int = 3, in_channels: int = 2):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3, pad_mode="pad", padding=1)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        self.head = nn.Dense(4, num_classes)

    def construct(self, x):
        return self.head(self.maxpool(self.relu(self.conv(x))).mean(axis=(2, 3)))


class _Data:
    num_classes = 3
    in_channels = 2


@pytest.mark.parametrize("conv_impl, expected", [("native", nn.MaxPool2d), ("auto", KernelMaxPool2d),
                                                 ("unfold", KernelMaxPool2d), ("channel_major", KernelMaxPool2d)])
def test_the_app_swaps_max_pooling_with_the_convolutions(graph_mode, conv_impl, expected):
    """Mutation caught: build_model not calling swap_max_pools leaves nn.MaxPool2d under auto."""
    network = build.build_model(OmegaConf.create({"model": {"_target_": "tests.models.test_pool.PoolNet",
                                                            "num_classes": None, "in_channels": None,
                                                            "conv_impl": conv_impl}}), _Data())
    assert type(network.maxpool) is expected
    assert (type(network.conv) is UnfoldConv2d) == (conv_impl != "native")
    assert network(Tensor(np.ones((2, 2, 8, 8), np.float32))).shape == (2, 3)


def test_a_trainkit_resnet_pools_on_the_kernel_in_its_channel_major_layout(graph_mode):
    """trainkit's resnet18 (channel-major under auto) built by the app: its max pooling on the kernel, its outputs
    those of the same weights built with conv_impl=native (to float32 rounding)."""
    def built(conv_impl):
        ms.set_seed(0)
        network = build.build_model(OmegaConf.create({"model": {"_target_": "trainkit.models.resnet18",
                                                                "num_classes": None, "in_channels": None,
                                                                "conv_impl": conv_impl}}), _Data())
        network.set_train(False)
        return network

    native, swapped = built("native"), built("auto")
    assert type(swapped.maxpool) is KernelMaxPool2d and type(native.maxpool) is nn.MaxPool2d
    ms.load_param_into_net(swapped, {p.name: p for p in native.get_parameters()})
    x = Tensor(np.random.default_rng(0).standard_normal((2, 2, 16, 16)).astype(np.float32))
    np.testing.assert_allclose(swapped(x).asnumpy(), native(x).asnumpy(), rtol=1e-4, atol=1e-5)
