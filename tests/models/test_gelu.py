"""model.gelu_impl: trainkit's fused exact GELU against the function written here in NumPy (math.erf, float64), and
the swap the app makes (only exact nn.GELU, no Parameter touched)."""
import math
import random

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from trainkit.app.build import build_model
from trainkit.errors import ConfigError
from trainkit.kernels import gelu_kernel
from trainkit.models.gelu import FusedGELU, swap_gelus

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


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)
        self.exact = nn.GELU(approximate=False)
        self.tanh = nn.GELU()
        self.body = nn.SequentialCell([nn.Dense(4, 3), nn.GELU(approximate=False)])

    def construct(self, x):
        return self.body(self.tanh(self.exact(self.dense(x))))


def test_the_swap_takes_only_exact_gelus_and_keeps_every_parameter():
    block = Block()
    before = {p.name: p for p in block.get_parameters()}
    x = ms.Tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    reference = block(x).asnumpy()
    assert swap_gelus(block, "fused") == 2
    assert isinstance(block.exact, FusedGELU) and isinstance(block.body[1], FusedGELU)
    assert type(block.tanh) is nn.GELU
    assert {p.name: p for p in block.get_parameters()} == before
    np.testing.assert_allclose(block(x).asnumpy(), reference, rtol=0, atol=1e-6)
    assert swap_gelus(Block(), "native") == 0


def test_a_bad_gelu_impl_is_one_line_naming_the_key():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"_target_": "trainkit.models.SmallCNN", "gelu_impl": "fast"}})
    with pytest.raises(ConfigError, match=r"model\.gelu_impl=fast is not valid: use one of auto, native, fused"):
        build_model(cfg, type("Data", (), {"num_classes": 3, "in_channels": 1})())


def test_a_model_without_the_argument_builds_with_it_set():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"_target_": "trainkit.models.SmallCNN", "gelu_impl": "native",
                                      "num_classes": None, "in_channels": None}})
    network = build_model(cfg, type("Data", (), {"num_classes": 3, "in_channels": 1})())
    assert network(ops.ones((2, 1, 8, 8), ms.float32)).shape == (2, 3)
