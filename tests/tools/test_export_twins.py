"""Export twins: each composition computes PyTorch's definition (written here in NumPy), and a network holding every
layer MindSpore's ONNX exporter lacks exports, runs in onnxruntime and agrees with the MindSpore network."""
import math
import random

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

import trainkit.tools.deploy as deploy
from trainkit.errors import ConfigError
from trainkit.tools import export_twins as twins

RANDOM_CASES = 50  # each some tens of MindSpore calls in PyNative mode: 3-6 s a test on the loaded 2-core machine


@pytest.fixture
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


def run(function, x, *args):
    return function(ms.Tensor(np.ascontiguousarray(x, np.float32)), *args).asnumpy()


# ------------------------------------------------------------------- NumPy: PyTorch's definitions
def torch_pool_output(length, kernel, stride, padding, ceil_mode):
    """PyTorch's pooling output size (torch.nn.MaxPool2d's documentation, with its ceil_mode rule)."""
    size = (length + 2 * padding - kernel + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (size - 1) * stride >= length + padding:
        size -= 1
    return size


def numpy_pool(x, kernel, stride, padding, ceil_mode, average, count_include_pad=True, divisor_override=None):
    """PyTorch's max_pool2d / avg_pool2d, one window at a time (aten's pooling kernels' index arithmetic)."""
    n, c, height, width = x.shape
    out_h = torch_pool_output(height, kernel[0], stride[0], padding[0], ceil_mode)
    out_w = torch_pool_output(width, kernel[1], stride[1], padding[1], ceil_mode)
    result = np.zeros((n, c, out_h, out_w), np.float64)
    for i in range(out_h):
        for j in range(out_w):
            h0, w0 = i * stride[0] - padding[0], j * stride[1] - padding[1]
            h1, w1 = min(h0 + kernel[0], height + padding[0]), min(w0 + kernel[1], width + padding[1])
            pool_size = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, height), min(w1, width)
            window = x[:, :, h0:h1, w0:w1]
            if not average:
                result[:, :, i, j] = window.max(axis=(2, 3))
                continue
            divisor = (divisor_override if divisor_override else
                       pool_size if count_include_pad else (h1 - h0) * (w1 - w0))
            result[:, :, i, j] = window.sum(axis=(2, 3)) / divisor
    return result


def numpy_adaptive(x, size, use_max):
    """PyTorch's adaptive pooling: output i of o covers [floor(i L / o), ceil((i + 1) L / o))."""
    height, width = x.shape[2:]
    result = np.zeros(x.shape[:2] + tuple(size))
    for i in range(size[0]):
        for j in range(size[1]):
            rows = slice(math.floor(i * height / size[0]), math.ceil((i + 1) * height / size[0]))
            columns = slice(math.floor(j * width / size[1]), math.ceil((j + 1) * width / size[1]))
            window = x[:, :, rows, columns]
            result[:, :, i, j] = window.max(axis=(2, 3)) if use_max else window.mean(axis=(2, 3))
    return result


# ------------------------------------------------------------------- each composition
def test_activations_are_pytorchs_definitions(pynative):
    """Mutations caught: relu6(x + 3) / 6 with another offset or scale; a coefficient of A-S 7.1.26 changed in its
    fourth digit; erf's sign select dropped (odd symmetry); GELU's 1/sqrt(2) left out."""
    x = np.concatenate([np.linspace(-8, 8, 3201), [-1e4, -30.0, 0.0, 30.0, 1e4]]).astype(np.float32)
    erf = np.array([math.erf(value) for value in x.astype(np.float64)])
    np.testing.assert_allclose(run(twins.hard_swish, x), x * np.clip(x + 3, 0, 6) / 6, atol=1e-6, rtol=0)
    np.testing.assert_allclose(run(twins.hard_sigmoid, x), np.clip(x + 3, 0, 6) / 6, atol=1e-6, rtol=0)
    np.testing.assert_allclose(run(twins.erf, x), erf, atol=2e-6, rtol=0)  # float32 rounding
    gelu = 0.5 * x * (1 + np.array([math.erf(value / math.sqrt(2)) for value in x.astype(np.float64)]))
    np.testing.assert_allclose(run(twins.gelu_erf, x), gelu, atol=2e-6, rtol=1e-6)


def test_pooling_is_pytorchs_on_random_shapes(pynative):
    """Padded, strided and ceil_mode max and average pooling, count_include_pad either way and divisor_override,
    on random sizes: PyTorch's outputs, window by window.

    Mutations caught: ceil_mode's last-window rule left out (an extra output), the divisor counting the padding
    beyond the input with count_include_pad=False, or a ceil_mode window's part beyond the padding with True;
    max padding of 0 instead of -inf (all-negative windows)."""
    draw = random.Random(0)
    # first, ceil_mode windows reaching beyond the padding (rare among random draws): 4 rows, kernel 3, stride 2
    cases = [((1, 2, 4, 5), (3, 3), (2, 2), (0, 1), True, include, 0) for include in (True, False)]
    for _ in range(RANDOM_CASES):
        kernel = (draw.randint(1, 4), draw.randint(1, 4))
        stride = (draw.randint(1, 3), draw.randint(1, 3))
        padding = (draw.randint(0, kernel[0] // 2), draw.randint(0, kernel[1] // 2))
        shape = (1, 2, draw.randint(max(1, kernel[0] - 2 * padding[0]), 9),
                 draw.randint(max(1, kernel[1] - 2 * padding[1]), 9))
        cases.append((shape, kernel, stride, padding, draw.random() < 0.5, draw.random() < 0.5,
                      draw.choice([0, 0, 0, 3])))
    for shape, kernel, stride, padding, ceil_mode, include, override in cases:
        x = np.random.default_rng(draw.randint(0, 10 ** 6)).normal(size=shape).astype(np.float32) - 2.0
        case = f"shape {shape}, kernel {kernel}, stride {stride}, padding {padding}, ceil_mode {ceil_mode}"
        np.testing.assert_allclose(run(twins.max_pool_2d, x, kernel, stride, padding, ceil_mode),
                                   numpy_pool(x, kernel, stride, padding, ceil_mode, False), atol=1e-6, err_msg=case)
        np.testing.assert_allclose(
            run(twins.avg_pool_2d, x, kernel, stride, padding, ceil_mode, include, override),
            numpy_pool(x, kernel, stride, padding, ceil_mode, True, include, override), atol=1e-5,
            err_msg=f"{case}, count_include_pad {include}, divisor_override {override}")


def test_adaptive_pooling_is_pytorchs_on_random_shapes(pynative):
    """Mutation caught: a bin's end rounded down (PyTorch's bins overlap where the sizes do not divide)."""
    draw = random.Random(0)
    for _ in range(RANDOM_CASES):
        shape = (1, 2, draw.randint(1, 7), draw.randint(1, 7))
        size = (draw.randint(1, shape[2] + 2), draw.randint(1, shape[3] + 2))
        x = np.random.default_rng(draw.randint(0, 10 ** 6)).normal(size=shape).astype(np.float32)
        for use_max in (False, True):
            np.testing.assert_allclose(run(twins.adaptive_pool_2d, x, size, use_max), numpy_adaptive(x, size, use_max),
                                       atol=1e-6, err_msg=f"shape {shape}, output {size}, max {use_max}")
    x = np.arange(24, dtype=np.float32).reshape(1, 1, 4, 6)
    np.testing.assert_allclose(run(twins.adaptive_pool_2d, x, (-1, 2), False), numpy_adaptive(x, (4, 2), False))


def test_constant_pad_and_unbind_are_numpys(pynative):
    """Mutations caught: the padding's pairs read from the first axis instead of the last (PyTorch's order); a
    negative amount padded instead of cropped; unbind keeping the axis."""
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(run(twins.constant_pad, x, (1, 2, 0, 3), 0.5),
                                  np.pad(x, ((0, 0), (0, 0), (0, 3), (1, 2)), constant_values=0.5))
    np.testing.assert_array_equal(run(twins.constant_pad, x, (0, 0, -1, 2, 1, 0), 0.0),
                                  np.pad(x[:, :, 1:, :], ((0, 0), (1, 0), (0, 2), (0, 0))))
    for axis in (1, -1):
        got = twins.unbind(ms.Tensor(x), axis)
        expected = [np.take(x, index, axis=axis) for index in range(x.shape[axis])]
        assert len(got) == len(expected)
        for part, want in zip(got, expected):
            np.testing.assert_array_equal(part.asnumpy(), want)


def test_group_norm_is_the_groups_mean_and_variance(pynative):
    """Mutation caught: the unbiased variance (N - 1), or the affine applied per group instead of per channel."""
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 3.0, (2, 6, 5, 3)).astype(np.float32)
    gamma, beta = rng.normal(size=6).astype(np.float32), rng.normal(size=6).astype(np.float32)
    grouped = x.reshape(2, 3, -1).astype(np.float64)
    expected = ((grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5))
    expected = expected.reshape(x.shape) * gamma[:, None, None] + beta[:, None, None]
    got = twins.group_norm(ms.Tensor(x), 3, ms.Tensor(gamma), ms.Tensor(beta), 1e-5).asnumpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def numpy_clamp(x, low, high):
    """PyTorch's clamp as its documentation defines it: below `low` becomes `low`, then above `high` becomes `high`
    (so `high` wins where low > high); a bound may be a number or an array broadcast against `x`."""
    out = x.astype(np.float64)
    if low is not None:
        out = np.where(out < low, low, out)
    if high is not None:
        out = np.where(out > high, high, out)
    return out


def test_clamp_is_pytorchs_on_random_bounds(pynative):
    """Number and tensor bounds (scalar tensors and tensors broadcast along the last axis), either one missing,
    and low > high, on random shapes: PyTorch's definition.

    Mutations caught: minimum and maximum swapped (low > high gives low); a missing bound taken as 0; a tensor bound
    broadcast along the wrong axis."""
    draw = random.Random(0)
    for case in range(150):
        shape = tuple(draw.randint(1, 5) for _ in range(draw.randint(1, 3)))
        x = np.random.default_rng(case).normal(size=shape).astype(np.float32) * 2

        def bound(shape=shape):
            kind = draw.choice(["none", "number", "scalar tensor", "row tensor"])
            if kind == "number":
                return draw.uniform(-2, 2), None
            if kind == "scalar tensor":
                value = np.float32(draw.uniform(-2, 2))
                return ms.Tensor(value), value
            if kind == "row tensor":
                value = np.random.default_rng(draw.randint(0, 10 ** 6)).uniform(-2, 2, shape[-1:]).astype(np.float32)
                return ms.Tensor(value), value
            return None, None

        (low, low_np), (high, high_np) = bound(), bound()
        if low is None and high is None:
            high, high_np = 0.25, None
        low_np = low if low_np is None else low_np
        high_np = high if high_np is None else high_np
        got = twins.clamp(ms.Tensor(x), low, high).asnumpy()
        np.testing.assert_allclose(got, numpy_clamp(x, low_np, high_np), atol=1e-6, rtol=0,
                                   err_msg=f"shape {shape}, low {low_np}, high {high_np}")


# ------------------------------------------------------------------- a network exported to ONNX
class Functional(nn.Cell):
    """Functions of ``ops`` as a ported model.py calls them (this module's ``ops`` global is swapped at export)."""

    def construct(self, x):
        return ops.cat((
            ops.hardswish(x).reshape(2, -1), ops.hardsigmoid(x).reshape(2, -1),
            ops.gelu(x, approximate='none').reshape(2, -1),
            ops.max_pool2d(x, 3, 2, 1, 1, ceil_mode=True).reshape(2, -1),
            ops.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False).reshape(2, -1),
            ops.adaptive_avg_pool2d(x, (3, 2)).reshape(2, -1), ops.adaptive_max_pool2d(x, (3, 2)).reshape(2, -1),
            ops.pad(x, (1, 2, 0, 1), value=0.5).reshape(2, -1), ops.unbind(x, 1)[2].reshape(2, -1),
            ops.clamp(x, min=-1.0).reshape(2, -1), ops.clip(x, -0.5, 0.75).reshape(2, -1)), 1)


BRANCHES = {
    "HSwish": nn.HSwish, "HSigmoid": nn.HSigmoid, "GELU": lambda: nn.GELU(approximate=False),
    "GELU tanh": lambda: nn.GELU(approximate=True), "SiLU": nn.SiLU, "ReLU6": nn.ReLU6,
    "LayerNorm": lambda: nn.LayerNorm((11,), -1, -1, 1e-6),
    "MaxPool2d": lambda: nn.MaxPool2d(3, 2, pad_mode="pad", padding=1, ceil_mode=True),
    "MaxPool2d valid": lambda: nn.MaxPool2d(2, 2),
    "AvgPool2d": lambda: nn.AvgPool2d(3, 2, pad_mode="pad", padding=1, ceil_mode=True, count_include_pad=False),
    "AvgPool2d include": lambda: nn.AvgPool2d(2, 2, pad_mode="pad", padding=1, ceil_mode=True),
    "AvgPool2d divisor": lambda: nn.AvgPool2d(3, 1, pad_mode="pad", padding=1, divisor_override=4),
    "AdaptiveAvgPool2d": lambda: nn.AdaptiveAvgPool2d((3, 5)), "AdaptiveAvgPool2d 1": lambda: nn.AdaptiveAvgPool2d(1),
    "AdaptiveMaxPool2d": lambda: nn.AdaptiveMaxPool2d((2, 4)), "GroupNorm": lambda: nn.GroupNorm(2, 4),
    "Conv2d 1x3": lambda: nn.Conv2d(4, 4, (1, 3), pad_mode="pad", padding=(0, 0, 1, 1), has_bias=True),
    "Conv2d 3x1": lambda: nn.Conv2d(4, 2, (3, 1), stride=(2, 1), pad_mode="pad", padding=(1, 1, 0, 0), group=2),
    "Conv2d 3x3": lambda: nn.Conv2d(4, 4, 3, pad_mode="pad", padding=1, has_bias=True),
}


class EveryLayer(nn.Cell):
    """Each branch on the same input, flattened side by side: a wrong twin shows in its own columns."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.branches = nn.CellList([make() for make in BRANCHES.values()])
        self.functional = Functional()

    def construct(self, x):
        x = self.stem(x)
        parts = [self.functional(x)]
        for branch in self.branches:
            parts.append(branch(x).reshape(2, -1))
        return ops.cat(parts, 1)


@pytest.fixture
def every_layer():
    network = EveryLayer()
    rng = np.random.default_rng(1)
    norm = network.branches[list(BRANCHES).index("GroupNorm")]
    norm.gamma.set_data(ms.Tensor(rng.normal(size=4).astype(np.float32)))
    norm.beta.set_data(ms.Tensor(rng.normal(size=4).astype(np.float32)))
    network.set_train(False)
    return network


def test_a_network_of_every_layer_exports_to_onnx_and_agrees(every_layer, tmp_path):
    """Run by onnxruntime, the file's outputs are the MindSpore network's within 1e-5 (relative to the largest);
    the network comes back as it was: its layers, its parameters' names, its modules' ``ops``.

    Mutations caught: a twin left out of twin_of (the export stops on its operator); a module's ``ops`` not put
    back (this module's ``ops`` stays export_ops)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(0).normal(size=(2, 3, 13, 11)).astype(np.float32) * 3
    expected = every_layer(ms.Tensor(x)).asnumpy()
    layers, names = [type(cell) for cell in every_layer.branches], [p.name for p in every_layer.get_parameters()]
    checked = deploy.write_checked(every_layer, x, expected, tmp_path / "every.onnx", "ONNX", batch_size=2)
    assert checked.composed == (  # not ReLU6, SiLU, LayerNorm, the tanh GELU, unpadded pooling, a 3x3 convolution
        "2 AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "3 AvgPool2d", "2 Conv2d", "GELU", "GroupNorm", "HSigmoid",
        "HSwish", "MaxPool2d", *(f"ops.{name}" for name in (
            "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool2d", "clamp", "clip", "gelu", "hardsigmoid",
            "hardswish", "max_pool2d", "pad", "unbind")))
    session = onnxruntime.InferenceSession(str(tmp_path / "every.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, expected, atol=1e-5 * np.abs(expected).max(), rtol=0)
    assert [type(cell) for cell in every_layer.branches] == layers
    assert [p.name for p in every_layer.get_parameters()] == names
    assert ops is ms.ops and globals()["ops"] is ms.ops


def test_without_the_twins_the_same_network_does_not_export(every_layer, tmp_path, monkeypatch):
    """The twins are what makes it export (MindSpore's exporter lacks the operators): nothing is written."""
    import contextlib

    monkeypatch.setattr(deploy, "onnx_twins", lambda network: contextlib.nullcontext([]))
    x = np.zeros((2, 3, 13, 11), np.float32)
    with pytest.raises(ConfigError, match="MindSpore cannot export this network as ONNX"):
        deploy.write_checked(every_layer, x, every_layer(ms.Tensor(x)).asnumpy(), tmp_path / "every.onnx", "ONNX", 2)
    assert list(tmp_path.iterdir()) == []


class CosineAttentionScale(nn.Cell):
    """Swin V2's cosine attention as a ported model.py writes it: ``x / clamp(|x|, min=1e-12)`` (a one-sided clamp:
    MindSpore's exporter stops on it, "Max value only accepts type of int or float") times
    ``exp(clamp(logit_scale, max=log 100))``."""

    def __init__(self, scale):
        super().__init__()
        self.logit_scale = ms.Parameter(ms.Tensor(np.asarray(scale, np.float32)), name="logit_scale")

    def construct(self, x):
        norm = ops.clamp(ops.sqrt((x * x).sum(-1, keepdims=True)), min=1e-12)
        return x / norm * ops.exp(ops.clamp(self.logit_scale, max=math.log(100.0)))


def test_swin_v2s_cosine_attention_exports_and_is_numpys(tmp_path, monkeypatch):
    """A logit scale above log 100 on one head and below it on the other, a row of zeros (the 1e-12 bound keeps it
    0): onnxruntime's outputs are NumPy's ``x / max(|x|, 1e-12) * exp(min(scale, log 100))``; without the twins the
    same cell does not export, and nothing is written.

    Mutation caught: clamp missing from export_ops (the export stops on the one-sided clamp)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    scale = np.array([[[0.5]], [[6.0]]], np.float32)  # 6 > log 100 = 4.6
    cell = CosineAttentionScale(scale)
    cell.set_train(False)
    x = np.random.default_rng(0).normal(size=(2, 2, 3, 4)).astype(np.float32)
    x[1, 0, 2] = 0.0
    wide = x.astype(np.float64)
    norm = np.sqrt((wide * wide).sum(-1, keepdims=True))
    expected = wide / np.where(norm < 1e-12, 1e-12, norm) * np.exp(np.minimum(scale, math.log(100.0)))
    deploy.write_checked(cell, x, expected, tmp_path / "scale.onnx", "ONNX", batch_size=2)
    session = onnxruntime.InferenceSession(str(tmp_path / "scale.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    import contextlib

    monkeypatch.setattr(deploy, "onnx_twins", lambda network: contextlib.nullcontext([]))
    bare = CosineAttentionScale(scale)  # a cell of its own: an exported cell's compiled graph is reused
    bare.set_train(False)
    with pytest.raises(ConfigError, match="MindSpore cannot export this network as ONNX .*Max value only accepts"):
        deploy.write_checked(bare, x, expected, tmp_path / "bare.onnx", "ONNX", batch_size=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["scale.onnx"]
