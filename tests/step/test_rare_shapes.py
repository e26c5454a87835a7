"""OpByOpForNewShapes: inside its block a shape the graph has not compiled runs op by op for its first calls.

Whether a call compiled is read from MindSpore's own graph executor (every graph-mode call of a Cell goes through
``_CellGraphExecutor.compile``; an op-by-op call never does), the outputs from NumPy's arithmetic, and op by op
against the compiled graph bit for bit on trainkit's networks at every AMP level.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.graph import api

from trainkit.models import SmallCNN
from trainkit.models.sequence import RowLSTM
from trainkit.step.mixed_precision import (
    AMP_LEVELS,
    Float32EvalCell,
    build_loss_network,
    casts_to_half,
    is_plain_float32,
)
from trainkit.step.rare_shapes import OpByOpForNewShapes


class Affine(OpByOpForNewShapes, nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 2)

    def construct(self, x):
        return self.dense(x)


@pytest.fixture
def graph_calls(monkeypatch):
    """The input shapes of every graph-mode call, in order."""
    shapes = []
    compile_ = api._CellGraphExecutor.compile

    def recorded(self, cell, *args, **kwargs):
        shapes.append(tuple(tuple(a.shape) for a in args if isinstance(a, Tensor)))
        return compile_(self, cell, *args, **kwargs)

    monkeypatch.setattr(api._CellGraphExecutor, "compile", recorded)
    ms.set_context(mode=ms.GRAPH_MODE)
    yield shapes
    ms.set_context(mode=ms.GRAPH_MODE)


def affine_expected(cell: Affine, x: np.ndarray) -> np.ndarray:
    weight, bias = cell.dense.weight.asnumpy().astype(np.float64), cell.dense.bias.asnumpy().astype(np.float64)
    return x.astype(np.float64) @ weight.T + bias


def test_a_new_shape_runs_op_by_op_for_its_first_calls_then_compiles(graph_calls):
    cell = Affine()
    rng = np.random.default_rng(0)
    known, new = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(7, 3)).astype(np.float32)
    np.testing.assert_allclose(cell(Tensor(known)).asnumpy(), affine_expected(cell, known), rtol=1e-5, atol=1e-6)
    assert graph_calls == [((4, 3),)]
    with cell.new_shapes_op_by_op(calls=2):
        outputs = [cell(Tensor(new)).asnumpy() for _ in range(2)]
        assert graph_calls == [((4, 3),)]  # neither call of the new shape went through the graph executor
        assert ms.get_context("mode") == ms.GRAPH_MODE
        cell(Tensor(known))  # a compiled shape stays a graph
        assert graph_calls == [((4, 3),), ((4, 3),)]
        compiled = cell(Tensor(new)).asnumpy()  # the third call of the new shape compiles it
        assert graph_calls[-1] == ((7, 3),)
    for output in outputs:
        np.testing.assert_allclose(output, affine_expected(cell, new), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(output, compiled)


def test_outside_the_block_every_shape_compiles_and_a_failing_call_restores_graph_mode(graph_calls):
    cell = Affine()
    cell(Tensor(np.ones((2, 3), np.float32)))
    cell(Tensor(np.ones((5, 3), np.float32)))
    assert graph_calls == [((2, 3),), ((5, 3),)]
    with cell.new_shapes_op_by_op():
        with pytest.raises((ValueError, RuntimeError, TypeError)):
            cell(Tensor(np.ones((5, 4), np.float32)))  # 4 features into a 3-input layer, op by op
        assert ms.get_context("mode") == ms.GRAPH_MODE
        with cell.new_shapes_op_by_op(calls=0):  # nested: zero calls op by op, then the outer block's again
            cell(Tensor(np.ones((6, 3), np.float32)))
        assert graph_calls[-1] == ((6, 3),)
        calls = len(graph_calls)
        cell(Tensor(np.ones((8, 3), np.float32)))
        assert len(graph_calls) == calls
    with pytest.raises(ValueError, match="calls must be an int >= 0"), cell.new_shapes_op_by_op(calls=-1):
        pass


def test_in_pynative_mode_the_block_changes_nothing(graph_calls):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell = Affine()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with cell.new_shapes_op_by_op():
        np.testing.assert_allclose(cell(Tensor(x)).asnumpy(), affine_expected(cell, x), rtol=1e-5, atol=1e-6)
    assert ms.get_context("mode") == ms.PYNATIVE_MODE and graph_calls == []


# O0 and O2 cover the two paths (op by op; compiled under AMP): O1 and O3 are slow, for the suite's time
@pytest.mark.parametrize("amp_level", [level if level in ("O0", "O2") else pytest.param(level, marks=pytest.mark.slow)
                                       for level in AMP_LEVELS])
@pytest.mark.parametrize("model", ["small_cnn", "row_lstm"])
def test_a_float32_evaluation_runs_op_by_op_bit_for_bit_and_an_amp_one_always_compiles(graph_calls, model,
                                                                                        amp_level):
    """What the test set's evaluation relies on: its figures are the ones the compiled graph gives. In half
    precision they would not be (MindSpore casts every operator's inputs op by op, only the Cell's in a graph:
    the small CNN at O2 gave losses of 50-320 against 2.3), so an AMP network compiles every shape."""
    ms.set_seed(0)
    backbone = SmallCNN(num_classes=10, in_channels=1) if model == "small_cnn" else RowLSTM(num_classes=10)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")
    cell = Float32EvalCell(build_loss_network(backbone, loss, amp_level).backbone, loss)
    cell.set_train(False)
    assert cell.op_by_op_allowed == (amp_level == "O0")
    rng = np.random.default_rng(1)
    images = Tensor(rng.normal(size=(37, 1, 8, 8)).astype(np.float32))
    labels = Tensor(rng.integers(0, 10, 37).astype(np.int32))
    with cell.new_shapes_op_by_op(calls=1):
        first = [o.asnumpy() for o in cell(images, labels)]
        assert graph_calls == ([] if amp_level == "O0" else [((37, 1, 8, 8), (37,))])
        compiled = [o.asnumpy() for o in cell(images, labels)]
        assert graph_calls[-1] == ((37, 1, 8, 8), (37,))
    for a, b in zip(first, compiled):
        np.testing.assert_array_equal(a, b)
    # the losses are the float32 cross entropy of the logits, whichever way they ran (NumPy, float64)
    logits = compiled[1].astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    expected = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(37), labels.asnumpy()]
    np.testing.assert_allclose(compiled[0], expected, rtol=1e-4, atol=1e-5)


def test_a_network_cast_by_to_float_or_holding_float16_parameters_is_not_plain_float32():
    dense = nn.Dense(3, 2)
    assert is_plain_float32(dense) and not casts_to_half(dense)
    half_cast = nn.SequentialCell([nn.Dense(3, 2).to_float(ms.float16)])
    assert casts_to_half(half_cast) and not is_plain_float32(half_cast)
    float_cast = nn.SequentialCell([nn.Dense(3, 2).to_float(ms.float32)])
    assert not casts_to_half(float_cast) and is_plain_float32(float_cast)
    half = nn.Dense(3, 2)
    half.scale = ms.Parameter(Tensor(np.ones(2, np.float16)), name="scale")
    assert not is_plain_float32(half) and not casts_to_half(half)  # nothing op by op would cast


@pytest.mark.slow  # the small CNN above runs the same convolution, batch-norm and kernel paths in the default suite
def test_resnet18_op_by_op_is_its_compiled_graph_bit_for_bit(graph_calls):
    from trainkit.models.resnet import resnet18

    ms.set_seed(0)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")
    cell = Float32EvalCell(resnet18(num_classes=10), loss)
    cell.set_train(False)
    rng = np.random.default_rng(2)
    images = Tensor(rng.normal(size=(5, 3, 32, 32)).astype(np.float32))
    labels = Tensor(rng.integers(0, 10, 5).astype(np.int32))
    with cell.new_shapes_op_by_op(calls=1):
        op_by_op = [o.asnumpy() for o in cell(images, labels)]
        compiled = [o.asnumpy() for o in cell(images, labels)]
    assert graph_calls == [((5, 3, 32, 32), (5,))]
    for a, b in zip(op_by_op, compiled):
        np.testing.assert_array_equal(a, b)
