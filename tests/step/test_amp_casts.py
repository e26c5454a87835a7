"""AMP levels really cast: which operations compute in float16, checked against float64 NumPy.

An operation that computes in float16 rounds its result to float16 (about 2.4e-4 to 4.9e-4 of its largest
value here); one in float32 stays within ~1e-7. Each chosen layer's output, caught with a forward hook
(pynative mode), is compared with NumPy applied to the very input that layer received:

* O0: everything float32;
* O1: the white list (``nn.Dense``: its MatMul and BiasAdd) in float16, results cast back to float32;
  batch norm and Tanh in float32;
* O2: everything but the black list in float16; batch norm computes in float32 (not only stores);
* O3: everything in float16, batch norm too.

The whole network's logits, in both modes, differ from float32 by more than float32 rounding at O1-O3 and
stay within float16 tolerance. Through the app: tests/test_cli.py (O1's rewrite kept in the run directory, the
level in the log) and tests/test_app_config_handover.py (O2 recorded in the final metrics).
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.common.models import TinyMLP, initial_weights
from trainkit.step.mixed_precision import applied_amp_level, build_loss_network

FLOAT16_ROUNDING = 2e-5  # above: the value was rounded to float16 (float16's is 2.4e-4 to 4.9e-4 here)
FLOAT32_ROUNDING = 2e-6  # below: float32 arithmetic (observed ~1e-7)
BN_EPS = 1e-5

# layer -> (dtype of its output, computed in float16?) per level
EXPECTED = {
    "O0": {"fc1": (ms.float32, False), "bn": (ms.float32, False), "act": (ms.float32, False),
           "fc2": (ms.float32, False)},
    "O1": {"fc1": (ms.float32, True), "bn": (ms.float32, False), "act": (ms.float32, False),
           "fc2": (ms.float32, True)},
    "O2": {"fc1": (ms.float16, True), "bn": (ms.float32, False), "act": (ms.float16, True),
           "fc2": (ms.float16, True)},
    "O3": {"fc1": (ms.float16, True), "bn": (ms.float16, True), "act": (ms.float16, True),
           "fc2": (ms.float16, True)},
}
LAYER_TYPES = {"fc1": "Dense", "bn": "BatchNorm1d", "act": "Tanh", "fc2": "Dense"}


def amp_network(level):
    net = TinyMLP(batch_norm=True)
    loss_net = build_loss_network(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), level)
    loss_net.set_train()  # batch norm with batch statistics
    return loss_net.backbone


def layers(backbone):
    """The network's own layers by TinyMLP name, whatever AMP wrapped around or rewrote them into."""
    found = {}
    for path, cell in backbone.cells_and_names():
        kinds = {klass.__name__ for klass in type(cell).__mro__}
        for name, kind in LAYER_TYPES.items():
            if kind in kinds and name in path.split(".") and name not in found:
                found[name] = cell
    assert sorted(found) == sorted(LAYER_TYPES), list(backbone.cells_and_names())
    return found


def numpy_layer(name, x):
    weights = {k: v.astype(np.float64) for k, v in initial_weights().items()}
    if name in ("fc1", "fc2"):
        return x @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]
    if name == "bn":  # training mode, gamma 1, beta 0
        return (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + BN_EPS)
    return np.tanh(x)


def relative_error(actual, expected):
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def numpy_logits(x):
    hidden = numpy_layer("fc1", x.astype(np.float64))
    return numpy_layer("fc2", np.tanh(numpy_layer("bn", hidden)))


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_each_level_computes_the_expected_layers_in_float16(level):
    ms.set_context(mode=ms.PYNATIVE_MODE)  # forward hooks run in pynative mode only
    try:
        backbone = amp_network(level)
        seen = {}
        for name, cell in layers(backbone).items():
            cell.register_forward_hook(
                lambda cell, inputs, output, name=name: seen.setdefault(name, (inputs[0], output)) and None)
        x = np.random.RandomState(5).randn(8, 4).astype(np.float32)
        backbone(ms.Tensor(x))
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    assert applied_amp_level(backbone) == level
    for name, (dtype, float16) in EXPECTED[level].items():
        layer_input, output = seen[name]
        error = relative_error(output.asnumpy().astype(np.float64),
                               numpy_layer(name, layer_input.asnumpy().astype(np.float64)))
        assert output.dtype == dtype, (name, output.dtype)
        if float16:
            assert FLOAT16_ROUNDING < error < 1e-2, (name, error)
        else:
            assert error < FLOAT32_ROUNDING, (name, error)


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_logits_differ_from_float32_by_float16_rounding(mode, level):
    x = np.random.RandomState(6).randn(8, 4).astype(np.float32)
    logits = amp_network(level)(ms.Tensor(x))
    assert logits.dtype == ms.float32  # the loss is computed in float32
    error = relative_error(logits.asnumpy().astype(np.float64), numpy_logits(x))
    if level == "O0":
        assert error < FLOAT32_ROUNDING
    else:
        assert FLOAT16_ROUNDING < error < 1e-2
