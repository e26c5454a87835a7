"""The global norm kernel (``kernels.norm_all_kernel``) and the norm the accumulation kernel returns: NumPy's exact
sum of squares rounded once, the same bits however the values are split into tensors, and not finite exactly when a
value is not (or the norm itself exceeds float32)."""
import math

import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple, Tensor, nn

from tests.common.kernels import needs_compiler
from trainkit import kernels

pytestmark = needs_compiler

# Around the threads' split (from 256 Ki values) and the kernel's blocks: boundaries fall inside tensors.
SIZES = [(3, 1), (300_001,), (7,), (2, 100_000), (1,), (0,), (16_389,)]


def exact_norm(arrays) -> np.float32:
    """The norm of the float32 values, summed exactly (math.fsum of their float64 squares), rounded once."""
    return np.float32(math.sqrt(math.fsum(float(v) ** 2 for a in arrays for v in a.reshape(-1).astype(np.float64))))


class Norm(nn.Cell):
    def __init__(self):
        super().__init__()
        self.kernel = kernels.norm_all_kernel()

    def construct(self, *tensors):
        return self.kernel(*tensors)


def norm_of(arrays) -> np.float32:
    out = Norm()(*(Tensor(a) for a in arrays)).asnumpy()
    assert out.shape == (1,) and out.dtype == np.float32
    return out[0]


def test_the_norm_is_the_exact_sum_of_squares_rounded_once_and_split_anywhere_the_same(mode, shared_cache):
    rng = np.random.default_rng(5)
    arrays = [(rng.standard_normal(shape) * rng.uniform(0.01, 100)).astype(np.float32) for shape in SIZES]
    got = norm_of(arrays)
    assert got == exact_norm(arrays)
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    for cuts in ([5], [1, 2, 3, 4, 5, 6, 7, 8, 9], [16_383, 16_385], [300_000, 300_010, 500_000]):
        parts = np.split(flat, cuts)
        assert norm_of(parts) == got, cuts


def test_not_finite_exactly_when_a_value_is_not(mode, shared_cache):
    """Squares that overflow float32 (1e20) are summed in double: the norm stays finite, unlike a float32 sum."""
    big = np.full((300_001,), 1e20, np.float32)
    assert norm_of([np.ones(3, np.float32), big]) == exact_norm([np.ones(3, np.float32), big])
    assert np.isfinite(norm_of([big]))
    for planted in (np.nan, np.inf, -np.inf):
        values = np.ones((2, 100_000), np.float32)
        values[1, 77_777] = planted
        got = norm_of([np.ones(5, np.float32), values])
        assert (np.isnan(got) if np.isnan(planted) else got == np.inf), planted
    assert norm_of([np.full(4, 3e38, np.float32)]) == np.inf  # the norm itself beyond float32


def test_a_tensor_that_is_not_float32_fails_the_call(shared_cache, graph_mode):
    with pytest.raises(RuntimeError):
        norm_of([np.ones(4, np.float16)])


class Accumulate(nn.Cell):
    def __init__(self, firsts):
        super().__init__()
        self.kernel = kernels.accumulate_all_kernel()
        self.buffers = ParameterTuple([Parameter(Tensor(first.copy()), name=f"buffer{i}")
                                       for i, first in enumerate(firsts)])

    def construct(self, values, first):
        return self.kernel(*self.buffers, *values, first)


def test_the_accumulation_kernel_returns_the_norm_of_the_sum_as_written(mode, shared_cache):
    rng = np.random.default_rng(8)
    cell = Accumulate([np.zeros(shape, np.float32) for shape in SIZES])
    expected = None
    for call, opens in enumerate([True, False, False, True, False]):
        values = [rng.standard_normal(shape).astype(np.float32) for shape in SIZES]
        norm = cell(tuple(Tensor(v) for v in values), Tensor(opens)).asnumpy()
        expected = values if opens else [e + v for e, v in zip(expected, values)]
        assert norm.shape == (1,) and norm[0] == exact_norm(expected), call
        assert norm[0] == norm_of([b.asnumpy() for b in cell.buffers]), call
