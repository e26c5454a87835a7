"""model.conv_impl on any network: each nn.Conv2d swapped for trainkit's convolution computes what MindSpore's
own kernel computes (forward and gradients), keeps its Parameters, and checkpoints move between implementations."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from omegaconf import OmegaConf

from trainkit.app import build
from trainkit.errors import ConfigError
from trainkit.models.conv import UnfoldConv2d
from trainkit.models.conv_swap import swap_convolutions

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


class _ForwardAndGrads(nn.Cell):
    """conv(x) and the gradients of sum(conv(x) * upstream) w.r.t. x and the parameters, in the current mode."""

    def __init__(self, network, upstream):
        super().__init__()
        self.network = network
        self.upstream = upstream
        self.grad = ops.GradOperation(get_all=True, get_by_list=True)
        self.params = ms.ParameterTuple(network.trainable_params())

    def forward(self, x):
        return (self.network(x) * self.upstream).sum()

    def construct(self, x):
        return self.network(x), self.grad(self.forward, self.params)(x)


SWAPPED = [  # in, out, kernel, stride, pad_mode, padding, dilation, group, bias
    (4, 6, 3, 1, "pad", 1, 1, 1, True),
    (4, 6, 3, 2, "pad", 1, 1, 2, False),  # grouped
    (4, 4, 3, 2, "pad", 1, 1, 4, True),  # depthwise
    (4, 8, 3, 1, "same", 0, 2, 1, True),  # "same" at stride 1 is symmetric padding
    (4, 6, 3, 1, "valid", 0, 1, 1, False),
    (4, 6, (3, 1), 1, "pad", (1, 1, 0, 0), 1, 1, False),
    (4, 6, 1, 2, "valid", 0, 1, 1, True),
    (4, 6, 5, 2, "pad", 2, 1, 1, False),
]


@pytest.mark.parametrize("in_channels, out_channels, kernel, stride, pad_mode, padding, dilation, group, bias", SWAPPED)
def test_a_swapped_conv2d_computes_what_nn_conv2d_computes_forward_and_backward(
        mode, in_channels, out_channels, kernel, stride, pad_mode, padding, dilation, group, bias):
    """Mutation caught: the swap taking conv.padding's top/left as (pad_w, pad_h) fails the (3, 1) kernel case."""
    rng = np.random.default_rng(in_channels * out_channels + stride + group)
    network = nn.SequentialCell([nn.Conv2d(in_channels, out_channels, kernel, stride=stride, pad_mode=pad_mode,
                                           padding=padding, dilation=dilation, group=group, has_bias=bias,
                                           bias_init="normal" if bias else None), nn.ReLU()])
    x = Tensor(rng.standard_normal((2, in_channels, 9, 9)).astype(np.float32))
    native_y = network[0](x).asnumpy()
    upstream = Tensor(rng.standard_normal(native_y.shape).astype(np.float32))

    def forward_and_grads():
        y, ((dx,), grads) = _ForwardAndGrads(network, upstream)(x)
        return [y.asnumpy(), dx.asnumpy()] + [g.asnumpy() for g in grads]

    native = forward_and_grads()
    parameters = list(network.get_parameters())
    assert swap_convolutions(network, "unfold") == 1
    assert type(network[0]) is UnfoldConv2d and not network[0].channel_major
    assert list(network.get_parameters()) == parameters  # the same Parameter objects
    swapped = forward_and_grads()
    assert len(swapped) == (4 if bias else 3)  # y, dx, dw (, db)
    for got, want in zip(swapped, native):
        np.testing.assert_allclose(got, want, **TOLERANCE)


class ConvNet(nn.Cell):
    """A user's network as the port writes one: nn.Conv2d in a SequentialCell, in a CellList and as attributes."""

    def __init__(self, num_classes: int = 3, in_channels: int = 2):
        super().__init__()
        self.stem = nn.SequentialCell([nn.Conv2d(in_channels, 8, 3, pad_mode="pad", padding=1, has_bias=True),
                                       nn.BatchNorm2d(8), nn.ReLU()])
        self.blocks = nn.CellList([nn.Conv2d(8, 8, 3, stride=2, pad_mode="pad", padding=1, group=8),
                                   nn.Conv2d(8, 16, 1, pad_mode="valid")])
        self.odd = nn.Conv2d(16, 16, 2, stride=2, pad_mode="same")  # "same" at stride 2: kept on MindSpore's kernel
        self.head = nn.Dense(16, num_classes)

    def construct(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.odd(x).mean(axis=(2, 3)))


class _Data:
    num_classes = 3
    in_channels = 2


def _built(conv_impl=None, target="tests.models.test_conv_swap.ConvNet", seed=0):
    node = {"_target_": target, "num_classes": None, "in_channels": None}
    if conv_impl is not None:
        node["conv_impl"] = conv_impl
    ms.set_seed(seed)
    network = build.build_model(OmegaConf.create({"model": node}), _Data())
    network.set_train(False)
    return network


def test_the_app_swaps_every_plain_conv2d_of_any_network_and_keeps_names(graph_mode):
    """Mutation caught: build_model not calling swap_convolutions leaves nn.Conv2d (the type assertions fail)."""
    native = _built("native")
    assert [type(c) for c in (native.stem[0], native.blocks[0], native.blocks[1])] == [nn.Conv2d] * 3
    for conv_impl in (None, "auto", "unfold", "channel_major"):  # no key: auto
        swapped = _built(conv_impl)
        assert [type(c) for c in (swapped.stem[0], swapped.blocks[0], swapped.blocks[1])] == [UnfoldConv2d] * 3
        assert not any(c.channel_major for c in (swapped.stem[0], swapped.blocks[0], swapped.blocks[1]))
        assert type(swapped.odd) is nn.Conv2d
        assert [(p.name, p.shape) for p in swapped.get_parameters()] == \
            [(p.name, p.shape) for p in native.get_parameters()]


@pytest.mark.parametrize("saved, loaded", [("native", "unfold"), ("unfold", "native"),
                                           ("native", "channel_major"), ("channel_major", "native")])
@pytest.mark.parametrize("target", ["tests.models.test_conv_swap.ConvNet", "trainkit.models.SmallCNN"])
def test_a_checkpoint_moves_between_implementations(graph_mode, tmp_path, saved, loaded, target):
    """Saved with one conv_impl, loaded (strictly) into a network built with another: the same outputs.

    Mutation caught: the swap giving the replacement new Parameters (its own zero weight) fails the comparison."""
    source = _built(saved, target, seed=1)
    ms.save_checkpoint(source, str(tmp_path / "model.ckpt"))
    destination = _built(loaded, target, seed=2)
    missing, unexpected = ms.load_param_into_net(destination, ms.load_checkpoint(str(tmp_path / "model.ckpt")),
                                                 strict_load=True)
    assert not missing and not unexpected
    x = Tensor(np.random.default_rng(3).standard_normal((2, 2, 8, 8)).astype(np.float32))
    np.testing.assert_allclose(destination(x).asnumpy(), source(x).asnumpy(), **TOLERANCE)


def test_a_bad_conv_impl_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"^model.conv_impl=fast is not valid: use one of auto, native, unfold, "
                                          r"channel_major$"):
        _built("fast")


def test_model_conv_impl_is_a_key_of_any_model_config():
    """A model whose class takes no conv_impl still accepts the key (the app reads it).

    Mutation caught: conv_impl left out of targets.CONSUMED["model"] makes it an unknown key of ConvNet."""
    from trainkit.app.targets import check_node

    check_node("model", OmegaConf.create({"_target_": "tests.models.test_conv_swap.ConvNet", "conv_impl": "unfold"}))
    with pytest.raises(ConfigError, match="unknown key model.conv_impll"):
        check_node("model", OmegaConf.create({"_target_": "tests.models.test_conv_swap.ConvNet", "conv_impll": "x"}))
