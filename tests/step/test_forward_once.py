"""One call of the wrapper runs the forward pass once: batch-norm moving statistics move by exactly one update.

`TrainOneStepCell`'s pattern (forward, then GradOperation's forward again) moves them twice in pynative mode.
The expected statistics are one NumPy training-mode update per micro-batch, in MindSpore's convention
(``mindspore/nn/layer/normalization.py``: ``moving = moving * momentum + batch * (1 - momentum)``, the
primitive getting ``1 - momentum``), with the unbiased batch variance (n / (n - 1): what
``nn.BatchNorm1d`` alone does on CPU in MindSpore 2.10, checked in both modes).
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.common.kernels import needs_compiler
from tests.common.models import TinyMLP, batches, initial_weights, loss_network
from trainkit import TrainingWrapper

MOMENTUM = 0.7  # TinyMLP's batch norm


def numpy_batch_norm_update(mean, variance, x, w1, b1):
    """One training-mode update of BatchNorm1d's moving statistics by the batch fc1(x)."""
    features = x.astype(np.float64) @ w1.T + b1
    n = len(features)
    batch_mean = features.mean(axis=0)
    batch_variance = features.var(axis=0) * n / (n - 1)
    return (MOMENTUM * mean + (1 - MOMENTUM) * batch_mean,
            MOMENTUM * variance + (1 - MOMENTUM) * batch_variance)


def moving_statistics(net):
    return net.bn.moving_mean.asnumpy().astype(np.float64), net.bn.moving_variance.asnumpy().astype(np.float64)


@pytest.mark.parametrize("features", [
    {},
    {"accumulation_steps": 2},
    {"accumulation_steps": 2, "loss_scale": 2.0 ** 8, "max_grad_norm": 1.0},
], ids=["plain", "accumulation", "accumulation_scaling_clipping"])
def test_each_call_moves_batch_norm_statistics_by_one_numpy_update(mode, features):
    """lr 0: fc1 stays at its initial weights, so every expected update is computed from known inputs."""
    net = TinyMLP(batch_norm=True)
    wrapper = TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), learning_rate=0.0), **features)
    wrapper.set_train()
    weights = initial_weights()
    w1, b1 = weights["fc1.weight"].astype(np.float64), weights["fc1.bias"].astype(np.float64)
    mean, variance = moving_statistics(net)
    np.testing.assert_array_equal(mean, 0.0)
    np.testing.assert_array_equal(variance, 1.0)
    for x, y in batches(4, 8, seed=31):
        wrapper(ms.Tensor(x), ms.Tensor(y, ms.int32))
        mean, variance = numpy_batch_norm_update(mean, variance, x, w1, b1)
        got_mean, got_variance = moving_statistics(net)
        np.testing.assert_allclose(got_mean, mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_variance, variance, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", [pytest.param("fused", marks=needs_compiler),
                                  pytest.param("branch", marks=needs_compiler), "no kernels"])
def test_a_skipped_window_puts_the_statistics_back_to_their_numpy_value_at_its_start(mode, shared_cache, monkeypatch,
                                                                                   path):
    """Accumulation over 3 micro-batches with the guard, a NaN in the second window's middle micro-batch: every call
    moves the statistics by one NumPy update (NaN from the planted one on), the skipped window ends with them back
    at the NumPy value of its start (bitwise what they held then), and ``_window_start`` holds that value from the
    window's first call on (copied before its forward pass). On each path that keeps them: the fused window
    (``nn.Momentum``), MindSpore's optimizer behind the guard's branch (``nn.SGD``: the statistics by one kernel
    call each way), and no kernels at all (a select per tensor). lr 0: fc1 stays at its initial weights.
    Mutations caught: the copy taken on every micro-step (``logical_not(first)`` dropped) or after the forward
    pass; the restore after the branch dropped."""
    k, windows, bad = 3, 4, 4  # micro-batch 4: the second window's middle one
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0" if path == "no kernels" else "1")
    net = TinyMLP(batch_norm=True)
    optimizer = (nn.Momentum(net.trainable_params(), learning_rate=0.0, momentum=0.9) if path == "fused"
                 else nn.SGD(net.trainable_params(), learning_rate=0.0))
    wrapper = TrainingWrapper(loss_network(net), optimizer, accumulation_steps=k, skip_nonfinite=True)
    assert (wrapper.accumulate_all is not None) == (path == "fused")
    assert (wrapper.restore_statistics_unless is not None) == (path != "no kernels")
    wrapper.set_train()
    window_start = {p.name: p for p in wrapper._window_start}
    weights = initial_weights()
    w1, b1 = weights["fc1.weight"].astype(np.float64), weights["fc1.bias"].astype(np.float64)
    data = batches(windows * k, 8, seed=33)
    data[bad][0][2, 1] = np.nan
    mean, variance = moving_statistics(net)
    for i, (x, y) in enumerate(data):
        if i % k == 0:
            start, start_bits = (mean, variance), moving_statistics(net)
        overflow = wrapper(ms.Tensor(x), ms.Tensor(y, ms.int32))[1]
        with np.errstate(invalid="ignore"):
            mean, variance = numpy_batch_norm_update(mean, variance, x, w1, b1)
        skipped = i == (bad // k + 1) * k - 1
        assert bool(overflow.asnumpy()) == skipped
        got = moving_statistics(net)
        if skipped:
            mean, variance = start
            for value, bits in zip(got, start_bits):
                np.testing.assert_array_equal(value, bits)
        np.testing.assert_allclose(got[0], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], variance, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(window_start["_window_start.bn.moving_mean"].asnumpy(), start[0], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(window_start["_window_start.bn.moving_variance"].asnumpy(), start[1], rtol=1e-5,
                                   atol=1e-6)
    assert np.all(np.isfinite(mean))  # the last window started from the restored statistics
