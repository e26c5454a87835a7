"""Each shipped `loss` option against its formula in NumPy."""
import mindspore as ms
import numpy as np
import pytest
from hydra.utils import instantiate

from trainkit.app.config import compose_config
from trainkit.errors import ConfigError
from trainkit.parts.losses import CrossEntropy

RNG = np.random.RandomState(0)
LOGITS = RNG.randn(6, 4).astype(np.float32)
CLASSES = np.array([0, 3, 1, 2, 3, 0], np.int32)
TARGETS = RNG.randn(6, 4).astype(np.float32) * 2
BINARY = (RNG.rand(6, 4) > 0.5).astype(np.float32)


def log_softmax(x):
    x = x.astype(np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def smooth_l1(d, beta=1.0):
    d = np.abs(d)
    return np.where(d < beta, 0.5 * d ** 2 / beta, d - 0.5 * beta)


def bce_with_logits(x, y):
    x = x.astype(np.float64)
    return np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))


@pytest.mark.parametrize("option, label, expected", [
    ("cross_entropy", CLASSES, -log_softmax(LOGITS)[np.arange(6), CLASSES].mean()),
    ("mse", TARGETS, ((LOGITS - TARGETS) ** 2).mean()),
    ("l1", TARGETS, np.abs(LOGITS - TARGETS).mean()),
    ("smooth_l1", TARGETS, smooth_l1(LOGITS - TARGETS).mean()),
    ("bce_with_logits", BINARY, bce_with_logits(LOGITS, BINARY).mean()),
])
def test_each_loss_option_computes_its_formula(graph_mode, option, label, expected):
    loss_fn = instantiate(compose_config([f"loss={option}", "run_dir=unused"]).loss)
    value = loss_fn(ms.Tensor(LOGITS), ms.Tensor(label)).asnumpy()
    assert value.shape == () and value == pytest.approx(expected, rel=1e-5)


def test_label_smoothing_spreads_epsilon_over_the_classes(graph_mode):
    epsilon, classes = 0.2, LOGITS.shape[1]
    log_p = log_softmax(LOGITS)
    target = np.full(log_p.shape, epsilon / classes)
    target[np.arange(6), CLASSES] += 1 - epsilon
    expected = -(target * log_p).sum(axis=1).mean()
    value = CrossEntropy(label_smoothing=epsilon)(ms.Tensor(LOGITS), ms.Tensor(CLASSES)).asnumpy()
    assert value == pytest.approx(expected, rel=1e-5)


def test_label_smoothing_out_of_range_names_the_argument():
    with pytest.raises(ConfigError, match=r"label_smoothing must be a number in \[0, 1\); got 1.0"):
        CrossEntropy(label_smoothing=1.0)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_takes_mixed_soft_targets(mode, smoothing):
    """MixUp/CutMix targets (float rows summing to 1): -sum(t * log_softmax) with t smoothed as PyTorch does,
    (1 - e) t + e / classes. Mutation caught: construct() ignoring the label's rank (the sparse kernel refuses
    float labels: red without smoothing)."""
    soft = np.abs(RNG.rand(6, 4)).astype(np.float32)
    soft /= soft.sum(axis=1, keepdims=True)
    smoothed = (1 - smoothing) * soft + smoothing / 4
    expected = -(smoothed * log_softmax(LOGITS)).sum(axis=1).mean()
    loss = CrossEntropy(label_smoothing=smoothing)
    assert float(loss(ms.Tensor(LOGITS), ms.Tensor(soft)).asnumpy()) == pytest.approx(expected, rel=1e-5)
