"""model.layer_impl: trainkit's fused exact GELU and max pooling against the functions written here in NumPy
(math.erf in float64; max pooling with -inf padding and its gradient), and the swap the app makes (only exact
nn.GELU and the pools the kernel computes, no Parameter touched)."""
import math
import random

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from trainkit.app.build import build_model
from trainkit.errors import ConfigError
from trainkit.kernels import gelu_kernel, pool_output_size
from trainkit.models.fused_layers import FusedBatchNorm2d, FusedGELU, FusedLayerNorm, FusedMaxPool2d, swap_layers

pytestmark = pytest.mark.skipif(gelu_kernel() is None, reason="trainkit's C++ kernels do not build here")

erf = np.vectorize(math.erf)


def gelu64(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_gradient64(x):
    x = x.astype(np.float64)
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def drawn_inputs(seed):
    """Values at every scale an activation takes: around 0, the erf's ranges, far tails, and exact zeros."""
    rng = random.Random(seed)
    scale = rng.choice([1e-6, 1e-2, 1.0, 3.0, 10.0, 100.0])
    shape = rng.choice([(7,), (3, 5), (2, 3, 4, 5), (64, 4096)])
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    values.reshape(-1)[:: max(1, values.size // 5)] = 0.0
    return values.astype(np.float32)


class SumOfProduct(nn.Cell):
    """sum(gelu(x) * w): its gradient by x is w * gelu'(x), with w drawn, so every element's gradient is checked."""

    def __init__(self, gelu):
        super().__init__()
        self.gelu = gelu

    def construct(self, x, w):
        return (self.gelu(x) * w).sum()


@pytest.mark.parametrize("seed", range(24))
def test_the_fused_gelu_and_its_gradient_are_the_exact_function(seed):
    x = drawn_inputs(seed)
    w = np.random.default_rng(seed + 100).standard_normal(x.shape).astype(np.float32)
    y = FusedGELU()(ms.Tensor(x)).asnumpy()
    expected = gelu64(x)
    assert np.all(np.abs(y - expected) <= 4e-7 * np.maximum(1.0, np.abs(expected)))
    gradient = ms.grad(SumOfProduct(FusedGELU()), grad_position=0)(ms.Tensor(x), ms.Tensor(w)).asnumpy()
    expected_gradient = w * gelu_gradient64(x)
    assert np.all(np.abs(gradient - expected_gradient) <= 1e-6 * np.maximum(1.0, np.abs(expected_gradient)))


def test_nan_stays_nan_and_the_tails_are_exact():
    x = np.array([np.nan, -1e30, -200.0, -30.0, 30.0, 200.0, 1e30], np.float32)
    y = FusedGELU()(ms.Tensor(x)).asnumpy()
    assert np.isnan(y[0])
    np.testing.assert_array_equal(y[1:], np.array([0.0, 0.0, 0.0, 30.0, 200.0, 1e30], np.float32))


def numpy_max_pool(x, kernel, stride, padding, dilation, ceil_mode, upstream):
    """PyTorch's max_pool2d in NumPy (padding as -inf; the first largest in row-major order) and the gradient of
    sum(y * upstream) by x."""
    n, c, h, w = x.shape
    out_h = pool_output_size(h, kernel, stride, padding, dilation, ceil_mode)
    out_w = pool_output_size(w, kernel, stride, padding, dilation, ceil_mode)
    y = np.full((n, c, out_h, out_w), -np.inf)
    dx = np.zeros_like(x, dtype=np.float64)
    for a in range(n):
        for b in range(c):
            for r in range(out_h):
                for q in range(out_w):
                    taken = [(i, j) for i in range(r * stride - padding, r * stride - padding + dilation * kernel,
                                                   dilation)
                             for j in range(q * stride - padding, q * stride - padding + dilation * kernel, dilation)
                             if 0 <= i < h and 0 <= j < w]
                    values = [x[a, b, i, j] for i, j in taken]
                    at = int(np.argmax(values))
                    y[a, b, r, q] = values[at]
                    dx[a, b][taken[at]] += upstream[a, b, r, q]
    return y, dx


def drawn_pool(seed):
    """A pooling PyTorch accepts (padding at most half the kernel) with at least one output."""
    rng = random.Random(seed)
    while True:
        kernel = rng.choice([1, 2, 3, 5])
        g = {"kernel": kernel, "stride": rng.choice([1, 2, 3]), "padding": rng.randint(0, kernel // 2),
             "dilation": rng.choice([1, 1, 2]), "ceil_mode": rng.random() < 0.4,
             "shape": (rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([1, 5, 8, 11]), rng.choice([2, 7, 9]))}
        h, w = g["shape"][2:]
        if min(h, w) + 2 * g["padding"] - g["dilation"] * (kernel - 1) - 1 >= 0:
            return g


class SumOfPool(nn.Cell):
    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def construct(self, x, upstream):
        return (self.pool(x) * upstream).sum()


@pytest.mark.parametrize("seed", range(30))
def test_the_fused_max_pool_and_its_gradient_are_pytorchs_max_pool(seed):
    g = drawn_pool(seed)
    x = np.random.default_rng(seed).standard_normal(g["shape"]).astype(np.float32)
    args = (g["kernel"], g["stride"], g["padding"], g["dilation"], g["ceil_mode"])
    pool = FusedMaxPool2d(g["kernel"], g["stride"], g["padding"], g["dilation"], g["ceil_mode"])
    y = pool(ms.Tensor(x)).asnumpy()
    upstream = np.random.default_rng(seed + 1).standard_normal(y.shape).astype(np.float32)
    expected, expected_dx = numpy_max_pool(x, *args, upstream)
    np.testing.assert_array_equal(y, expected.astype(np.float32))
    dx = ms.grad(SumOfPool(pool), grad_position=0)(ms.Tensor(x), ms.Tensor(upstream)).asnumpy()
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-6, atol=1e-6)


def test_a_nan_in_a_window_is_its_maximum():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan
    y = FusedMaxPool2d(2, 2)(ms.Tensor(x)).asnumpy()
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0, 1, 1] == 15.0


def numpy_layer_norm(x, gamma, beta, epsilon, upstream):
    """The layer norm over the last axis in float64 NumPy and the gradients of sum(y * upstream) by x, gamma, beta."""
    x, gamma, beta, upstream = (a.astype(np.float64) for a in (x, gamma, beta, upstream))
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
    xhat = (x - mean) * rstd
    g = upstream * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return xhat * gamma + beta, dx, (upstream * xhat).sum(axis=axes), upstream.sum(axis=axes)


class SumOfNorm(nn.Cell):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def construct(self, x, upstream):
        return (self.norm(x) * upstream).sum()


@pytest.mark.parametrize("seed", range(20))
def test_the_fused_layer_norm_and_its_gradients_are_numpys(seed):
    rng = random.Random(seed)
    d = rng.choice([1, 3, 8, 96, 384])
    shape = rng.choice([(5,), (2, 3), (4, 8, 8), (130,)]) + (d,)  # 130 rows: three blocks of the gradient's sums
    values = np.random.default_rng(seed)
    x = (values.standard_normal(shape) * rng.choice([1e-3, 1.0, 50.0]) + rng.choice([0.0, 3.0])).astype(np.float32)
    layer = nn.LayerNorm((d,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=rng.choice([1e-5, 1e-6]))
    layer.gamma.set_data(ms.Tensor(values.standard_normal(d).astype(np.float32)))
    layer.beta.set_data(ms.Tensor(values.standard_normal(d).astype(np.float32)))
    fused = FusedLayerNorm(layer)
    upstream = values.standard_normal(shape).astype(np.float32)
    y, dx, dgamma, dbeta = numpy_layer_norm(x, layer.gamma.asnumpy(), layer.beta.asnumpy(), layer.epsilon, upstream)
    np.testing.assert_allclose(fused(ms.Tensor(x)).asnumpy(), y, rtol=1e-5, atol=1e-5)
    grad = ms.grad(SumOfNorm(fused), grad_position=0, weights=fused.trainable_params())
    got_dx, (got_dgamma, got_dbeta) = grad(ms.Tensor(x), ms.Tensor(upstream))
    scale = max(1.0, float(np.abs(dx).max()))
    np.testing.assert_allclose(got_dx.asnumpy(), dx, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(got_dgamma.asnumpy(), dgamma, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got_dbeta.asnumpy(), dbeta, rtol=1e-5, atol=1e-4)


class ConvThenNorm(nn.Cell):
    """sum(norm(conv(x)) * upstream): the norm's input has a gradient, as in a network."""

    def __init__(self, norm, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 1, has_bias=False, weight_init="ones")
        self.norm = norm

    def construct(self, x, upstream):
        return (self.norm(self.conv(x)) * upstream).sum()


@pytest.mark.parametrize("seed", range(12))
def test_the_fused_batch_norm_trains_as_numpys_and_evaluates_as_mindspores(mode, seed):
    """Forward, the three gradients and the moving statistics (PyTorch's update: the variance unbiased) against
    NumPy over two steps; evaluation reads the moving statistics."""
    rng = random.Random(seed)
    values = np.random.default_rng(seed)
    c = rng.choice([1, 3, 16])
    shape = (rng.choice([1, 2, 5]), c, rng.choice([1, 3, 8]), rng.choice([1, 4, 9]))
    if shape[0] * shape[2] * shape[3] == 1:
        shape = (2,) + shape[1:]
    momentum, eps = rng.choice([0.9, 0.5]), rng.choice([1e-5, 1e-3])
    layer = nn.BatchNorm2d(c, momentum=momentum, eps=eps)
    layer.gamma.set_data(ms.Tensor(values.standard_normal(c).astype(np.float32)))
    layer.beta.set_data(ms.Tensor(values.standard_normal(c).astype(np.float32)))
    net = ConvThenNorm(FusedBatchNorm2d(layer), c)
    net.set_train(True)
    grad = ms.value_and_grad(net, grad_position=0, weights=[layer.gamma, layer.beta])
    moving_mean, moving_var = np.zeros(c), np.ones(c)
    gamma, beta = layer.gamma.asnumpy().astype(np.float64), layer.beta.asnumpy().astype(np.float64)
    for _ in range(2):
        x = (values.standard_normal(shape) * 2 + 1).astype(np.float32)
        upstream = values.standard_normal(shape).astype(np.float32)
        loss, (dx, (dgamma, dbeta)) = grad(ms.Tensor(x), ms.Tensor(upstream))
        x64, up = x.astype(np.float64), upstream.astype(np.float64)  # the conv of ones sums the channels
        h = np.repeat(x64.sum(axis=1, keepdims=True), c, axis=1)
        m = shape[0] * shape[2] * shape[3]
        mean, var = h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))
        rstd = 1.0 / np.sqrt(var + eps)
        xhat = (h - mean[None, :, None, None]) * rstd[None, :, None, None]
        y = xhat * gamma[None, :, None, None] + beta[None, :, None, None]
        expected_dgamma, expected_dbeta = (up * xhat).sum(axis=(0, 2, 3)), up.sum(axis=(0, 2, 3))
        dh = (gamma * rstd)[None, :, None, None] * (up - expected_dbeta[None, :, None, None] / m
                                                    - xhat * expected_dgamma[None, :, None, None] / m)
        expected_dx = np.repeat(dh.sum(axis=1, keepdims=True), c, axis=1)
        np.testing.assert_allclose(loss.asnumpy(), (y * up).sum(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(dgamma.asnumpy(), expected_dgamma, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dbeta.asnumpy(), expected_dbeta, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(dx.asnumpy(), expected_dx, rtol=1e-4, atol=1e-4)
        weight = 1.0 - momentum
        moving_mean = (1 - weight) * moving_mean + weight * mean
        moving_var = (1 - weight) * moving_var + weight * (var * m / (m - 1))
        np.testing.assert_allclose(layer.moving_mean.asnumpy(), moving_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.moving_variance.asnumpy(), moving_var, rtol=1e-5, atol=1e-6)
    net.set_train(False)
    x = values.standard_normal(shape).astype(np.float32)
    h = np.repeat(x.astype(np.float64).sum(axis=1, keepdims=True), c, axis=1)
    expected = ((h - moving_mean[None, :, None, None]) / np.sqrt(moving_var[None, :, None, None] + eps)
                * gamma[None, :, None, None] + beta[None, :, None, None])
    np.testing.assert_allclose(net.norm(net.conv(ms.Tensor(x))).asnumpy(), expected, rtol=1e-4, atol=1e-4)


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)
        self.exact = nn.GELU(approximate=False)
        self.tanh = nn.GELU()
        self.body = nn.SequentialCell([nn.Dense(4, 16), nn.GELU(approximate=False)])
        self.padded = nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)
        self.valid = nn.MaxPool2d(2, 1)
        self.same = nn.MaxPool2d(2, 1, pad_mode="same")
        self.norm = nn.LayerNorm((4,), begin_norm_axis=-1, begin_params_axis=-1)
        self.norm_of_two_axes = nn.LayerNorm((4, 4), begin_norm_axis=2, begin_params_axis=2)
        self.batch_norm = nn.BatchNorm2d(1)

    def construct(self, x):
        x = self.norm_of_two_axes(self.body(self.tanh(self.exact(self.norm(self.dense(x))))).reshape((-1, 1, 4, 4)))
        return self.batch_norm(self.same(self.valid(self.padded(x))))


def test_the_swap_takes_only_the_layers_the_kernels_compute_and_keeps_every_parameter():
    block = Block()
    before = {p.name: p for p in block.get_parameters()}
    x = ms.Tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    block.set_train(False)  # evaluation: the batch norm reads its moving statistics, as the swapped one does
    reference = block(x).asnumpy()
    assert swap_layers(block, "fused") == {"GELU": 2, "MaxPool2d": 2, "LayerNorm": 1, "BatchNorm2d": 1}
    assert isinstance(block.norm, FusedLayerNorm) and type(block.norm_of_two_axes) is nn.LayerNorm
    assert isinstance(block.exact, FusedGELU) and isinstance(block.body[1], FusedGELU)
    assert isinstance(block.padded, FusedMaxPool2d) and isinstance(block.valid, FusedMaxPool2d)
    assert type(block.tanh) is nn.GELU and type(block.same) is nn.MaxPool2d
    assert isinstance(block.batch_norm, FusedBatchNorm2d)
    after = {p.name: p for p in block.get_parameters()}
    assert after.keys() == before.keys() and all(after[name] is before[name] for name in before)
    np.testing.assert_allclose(block(x).asnumpy(), reference, rtol=0, atol=1e-6)
    assert swap_layers(Block(), "native") == {"GELU": 0, "MaxPool2d": 0, "LayerNorm": 0, "BatchNorm2d": 0}


def test_a_bad_layer_impl_is_one_line_naming_the_key():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"_target_": "trainkit.models.SmallCNN", "layer_impl": "fast"}})
    with pytest.raises(ConfigError, match=r"model\.layer_impl=fast is not valid: use one of auto, native, fused"):
        build_model(cfg, type("Data", (), {"num_classes": 3, "in_channels": 1})())


def test_a_model_without_the_argument_builds_with_it_set():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"_target_": "trainkit.models.SmallCNN", "layer_impl": "native",
                                      "num_classes": None, "in_channels": None}})
    network = build_model(cfg, type("Data", (), {"num_classes": 3, "in_channels": 1})())
    assert network(ops.ones((2, 1, 8, 8), ms.float32)).shape == (2, 3)


@pytest.mark.parametrize("target", ["trainkit.models.SmallCNN", "trainkit.models.mlp.MLP",
                                    "tests.common.models.GeluDigits"])
def test_every_implementation_key_passes_the_key_check_of_any_model(target):
    """`model.conv_impl` and `model.layer_impl` are documented for any model: the app's unknown-key check lets
    each through, whether or not the model's constructor takes it (a user's `+model.layer_impl=native`)."""
    from omegaconf import OmegaConf

    from trainkit.app.targets import IMPLEMENTATION_KEYS, check_node

    for key in IMPLEMENTATION_KEYS:
        check_node("model", OmegaConf.create({"_target_": target, key: "native"}))
    with pytest.raises(ConfigError, match=r"unknown key model\.layer_imp:"):
        check_node("model", OmegaConf.create({"_target_": target, "layer_imp": "native"}))
