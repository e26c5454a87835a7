"""The wrapper's reductions treat small tensors together and large ones one by one: both paths against NumPy."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from tests.common.kernels import needs_compiler
from trainkit.step.grad_ops import SMALL_TENSOR, all_finite, float32_total, size_groups, small_concat

SHAPES = [(3,), (SMALL_TENSOR,), (SMALL_TENSOR + 1,), (4, 5, 3, 3), (300, 300), (7, 1)]


class Totals(nn.Cell):
    def __init__(self, shapes, joined=False):
        super().__init__()
        self.groups = size_groups([np.empty(s) for s in shapes])
        self.hyper_map = ops.HyperMap()
        self.concat = small_concat([Tensor(np.empty(s, np.float32)) for s in shapes], self.groups) if joined else None
        assert self.concat is not None or not joined

    def construct(self, tensors):
        return (float32_total(self.hyper_map, tensors, self.groups, squared=True, concat=self.concat),
                float32_total(self.hyper_map, tensors, self.groups, squared=False, concat=self.concat),
                all_finite(self.hyper_map, tensors, self.groups, concat=self.concat))


def test_size_groups_split_at_small_tensor():
    small, large = size_groups([np.empty(s) for s in SHAPES])
    assert small == (0, 1, 3, 5) and large == (2, 4)


@pytest.mark.parametrize("planted", [None, (1, np.nan), (2, np.inf), (4, -np.inf)],
                         ids=["finite", "nan-small", "inf-large", "neg-inf-large"])
def test_totals_equal_numpy_on_small_and_large_tensors(mode, planted):
    rng = np.random.RandomState(0)
    arrays = [rng.randn(*shape).astype(np.float32) for shape in SHAPES]
    if planted is not None:
        index, value = planted
        arrays[index].flat[5] = value
    squares, total, finite = Totals(SHAPES)(tuple(Tensor(a) for a in arrays))
    wide = [a.astype(np.float64) for a in arrays]
    assert bool(finite.asnumpy()) == (planted is None)
    if planted is None:
        np.testing.assert_allclose(squares.asnumpy(), sum((a * a).sum() for a in wide), rtol=1e-5)
        np.testing.assert_allclose(total.asnumpy(), sum(a.sum() for a in wide), rtol=1e-4, atol=1e-2)


@needs_compiler
@pytest.mark.parametrize("planted", [None, (3, np.nan), (0, np.inf)], ids=["finite", "nan-small", "inf-small"])
def test_the_small_tensors_joined_by_one_kernel_answer_the_finite_check_alike(mode, shared_cache, planted):
    """The wrapper's finite checks join the small tensors with ``TrainkitConcatAll`` where the kernels build: the
    same answer as ``ops.concat`` of their reshapes, and sums within float32 rounding of NumPy's (not always the
    same bits: MindSpore rewrites a ReduceSum of a Concat). Mutation caught: the kernel's copy of each tensor
    stopping one value short (a NaN planted in a tensor's last value went unseen)."""
    rng = np.random.RandomState(1)
    arrays = [rng.randn(*shape).astype(np.float32) for shape in SHAPES]
    if planted is not None:
        arrays[planted[0]].flat[-1] = planted[1]
    tensors = tuple(Tensor(a) for a in arrays)
    joined, plain = Totals(SHAPES, joined=True)(tensors), Totals(SHAPES)(tensors)
    assert bool(joined[2].asnumpy()) == bool(plain[2].asnumpy()) == (planted is None)
    if planted is None:
        wide = [a.astype(np.float64) for a in arrays]
        np.testing.assert_allclose(joined[0].asnumpy(), sum((a * a).sum() for a in wide), rtol=1e-5)
        np.testing.assert_allclose(joined[1].asnumpy(), sum(a.sum() for a in wide), rtol=1e-4, atol=1e-2)


class LoopedNorm(nn.Cell):
    """The squared sum as grad_ops computed it before the picks by position: the same operators, in a loop."""

    def __init__(self, groups):
        super().__init__()
        self.small, self.large = groups

    def construct(self, tensors):
        flat = ()
        for i in self.small:
            flat = flat + (tensors[i].reshape((-1,)).astype(ms.float32),)
        joined = ops.concat(flat)
        parts = (ops.reduce_sum(joined * joined),)
        for i in self.large:
            rows = tensors[i].reshape((tensors[i].shape[0], -1)).astype(ms.float32)
            parts = parts + (ops.reduce_sum(ops.reduce_sum(rows * rows, 1)),)
        return ops.addn(parts)


def test_the_norms_squared_sum_is_bitwise_the_looped_operators(graph_mode):
    """Picking the tensors by a map over their positions (fewer nodes to compile) computes the same operators as
    the loop it replaced: the same bits. Mutation caught: the small tensors' concat reversed."""
    rng = np.random.RandomState(2)
    arrays = [(rng.randn(*shape) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32) for shape in SHAPES]
    tensors = tuple(Tensor(a) for a in arrays)
    got = Totals(SHAPES)(tensors)[0]
    np.testing.assert_array_equal(got.asnumpy(), LoopedNorm(size_groups(arrays))(tensors).asnumpy())
