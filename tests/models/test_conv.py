"""model.conv_impl: the im2col + MatMul convolution equals nn.Conv2d and NumPy, forward and backward."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from trainkit import kernels
from trainkit.models import SmallCNN, resnet18
from trainkit.models.conv import CONV_IMPLS, UnfoldConv2d, conv2d, resolve_conv_impl

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def np_conv_and_grads(x, w, b, upstream, stride, padding, dilation, groups):
    """y = conv2d(x, w) + b (torch semantics) and the gradients of sum(y * upstream) w.r.t. x, w and b, in NumPy."""
    n, channels, height, width = x.shape
    out_channels, per_group, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding))).astype(np.float64)
    out_h = (height + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    out_w = (width + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, out_channels, out_h, out_w))
    dxp = np.zeros_like(xp)
    dw = np.zeros(w.shape)
    outs_per_group = out_channels // groups
    for o in range(out_channels):
        first = (o // outs_per_group) * per_group
        for a in range(kh):
            for c in range(kw):
                rows = slice(a * dilation, a * dilation + (out_h - 1) * stride + 1, stride)
                cols = slice(c * dilation, c * dilation + (out_w - 1) * stride + 1, stride)
                patch = xp[:, first:first + per_group, rows, cols]          # [N, per_group, out_h, out_w]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, a, c])
                dw[o, :, a, c] = np.einsum("nchw,nhw->c", patch, upstream[:, o])
                dxp[:, first:first + per_group, rows, cols] += np.einsum("nhw,c->nchw", upstream[:, o], w[o, :, a, c])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    dx = dxp[:, :, padding:padding + height, padding:padding + width]
    db = None if b is None else upstream.sum(axis=(0, 2, 3))
    return y, dx, dw, db


class _ForwardAndGrads(nn.Cell):
    """sum(conv(x) * upstream) and its gradients w.r.t. x and the conv's parameters, in the current mode."""

    def __init__(self, conv, upstream):
        super().__init__()
        self.conv = conv
        self.upstream = upstream
        self.grad = ops.GradOperation(get_all=True, get_by_list=True)
        self.params = ms.ParameterTuple(conv.trainable_params())

    def forward(self, x):
        return (self.conv(x) * self.upstream).sum()

    def construct(self, x):
        return self.conv(x), self.grad(self.forward, self.params)(x)


CASES = [  # kernel, stride, padding, dilation, groups, bias
    (3, 1, 1, 1, 1, False),
    (3, 2, 1, 1, 1, True),
    (3, 2, 1, 1, 2, False),
    (3, 1, 2, 2, 1, False),
    (1, 2, 0, 1, 1, True),
    (7, 2, 3, 1, 1, False),
    (1, 1, 0, 1, 2, False),  # the input is its own columns
]


@pytest.fixture(params=["channel_major", "kernel", "unfold"])
def columns(request, monkeypatch):
    """Which im2col an UnfoldConv2d built now uses: trainkit's C++ kernel (where it builds) on (C, N, H, W) or
    (N, C, H, W) activations, or ops.unfold."""
    if request.param != "unfold" and kernels.library()[0] is None:
        pytest.skip(f"trainkit's kernels do not build here: {kernels.describe()}")
    if request.param == "unfold":
        monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    return request.param


@pytest.mark.parametrize("kernel, stride, padding, dilation, groups, bias", CASES)
def test_unfold_conv_matches_numpy_and_nn_conv2d_forward_and_backward(mode, columns, kernel, stride, padding,
                                                                       dilation, groups, bias):
    rng = np.random.default_rng(kernel * 100 + stride * 10 + groups)
    in_channels, out_channels = 4, 6
    x = rng.standard_normal((2, in_channels, 9, 9)).astype(np.float32)
    ours = UnfoldConv2d(in_channels, out_channels, kernel, stride=stride, pad_mode="pad", padding=padding,
                        dilation=dilation, group=groups, has_bias=bias, bias_init="normal" if bias else None,
                        channel_major=columns == "channel_major")
    assert (ours.im2col is not None) == (columns != "unfold" and (kernel > 1 or stride > 1))
    native = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, pad_mode="pad", padding=padding,
                       dilation=dilation, group=groups, has_bias=bias)
    for ours_param, native_param in zip(ours.get_parameters(), native.get_parameters()):
        native_param.set_data(ours_param.data.copy())
    w = ours.weight.asnumpy()
    b = ours.bias.asnumpy() if bias else None
    out_h = (9 + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    upstream = rng.standard_normal((2, out_channels, out_h, out_h)).astype(np.float32)
    expected = np_conv_and_grads(x.astype(np.float64), w.astype(np.float64), b, upstream, stride, padding,
                                 dilation, groups)

    results = {}
    for name, conv in (("unfold", ours), ("native", native)):
        if name == "unfold" and columns == "channel_major":  # (C, N, H, W) in and out; compared as (N, C, H, W)
            y, ((dx,), param_grads) = _ForwardAndGrads(conv, Tensor(upstream.transpose(1, 0, 2, 3).copy()))(
                Tensor(x.transpose(1, 0, 2, 3).copy()))
            y, dx = Tensor(y.asnumpy().transpose(1, 0, 2, 3)), Tensor(dx.asnumpy().transpose(1, 0, 2, 3))
        else:
            y, ((dx,), param_grads) = _ForwardAndGrads(conv, Tensor(upstream))(Tensor(x))
        results[name] = [y.asnumpy(), dx.asnumpy()] + [g.asnumpy() for g in param_grads]
    assert len(results["unfold"]) == (4 if bias else 3)
    for got, want in zip(results["unfold"], [e for e in expected if e is not None]):
        np.testing.assert_allclose(got, want, **TOLERANCE)
    for got, want in zip(results["unfold"], results["native"]):
        np.testing.assert_allclose(got, want, **TOLERANCE)


def test_auto_is_channel_major_on_cpu_with_the_kernels_unfold_without_and_native_elsewhere(monkeypatch):
    assert resolve_conv_impl("auto", "CPU") == ("channel_major" if kernels.library()[0] else "unfold")
    assert resolve_conv_impl("auto", "GPU") == "native"
    assert resolve_conv_impl("auto", "Ascend") == "native"
    assert resolve_conv_impl("native", "CPU") == "native"
    assert set(CONV_IMPLS) == {"auto", "native", "unfold", "channel_major"}
    assert type(conv2d(2, 3, 3, conv_impl="native")) is nn.Conv2d
    assert isinstance(conv2d(2, 3, 3, conv_impl="unfold"), UnfoldConv2d)
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    assert resolve_conv_impl("auto", "CPU") == "unfold"
    with pytest.raises(ValueError, match=r"conv_impl=channel_major needs trainkit's C\+\+ kernels, which cannot run "
                                         r"here \(TRAINKIT_FUSED_KERNELS=0\); use conv_impl=unfold or auto"):
        resolve_conv_impl("channel_major", "CPU")
    with pytest.raises(ValueError, match=r"channel_major needs .*the device is GPU"):
        resolve_conv_impl("channel_major", "GPU")


def test_an_unknown_conv_impl_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"conv_impl must be one of auto, native, unfold, channel_major; got 'fast'"):
        SmallCNN(conv_impl="fast")


def test_asymmetric_padding_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match="symmetric.*conv_impl=native"):
        UnfoldConv2d(2, 3, 3, pad_mode="pad", padding=(1, 0, 1, 1))
    with pytest.raises(ValueError, match="pad_mode must be 'pad' or 'valid'.*conv_impl=native"):
        UnfoldConv2d(2, 3, 3, pad_mode="same")


def test_parameters_are_the_same_so_a_checkpoint_moves_between_implementations(graph_mode):
    """Same names and shapes; weights saved from the native network give the same outputs in the unfold one."""
    def layout(net):
        return {p.name: p.shape for p in net.get_parameters()}
    assert layout(resnet18(conv_impl="unfold")) == layout(resnet18(conv_impl="native"))

    ms.set_seed(1)
    native = SmallCNN(in_channels=3, conv_impl="native")
    ms.set_seed(2)
    unfold = SmallCNN(in_channels=3, conv_impl="unfold")
    assert layout(native) == layout(unfold)
    ms.load_param_into_net(unfold, {p.name: p for p in native.get_parameters()}, strict_load=True)
    native.set_train(False)
    unfold.set_train(False)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32))
    np.testing.assert_allclose(unfold(x).asnumpy(), native(x).asnumpy(), **TOLERANCE)
