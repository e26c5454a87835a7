"""The non-finite guard without loss scaling: a planted NaN/inf window leaves no trace on weights, optimizer state,
EMA or batch-norm moving statistics; with the guard off the bare step is unchanged."""
import numpy as np
import pytest
from mindspore import nn, ops

from tests.common.models import TinyMLP, batches, initial_weights, loss_network, run, weights_of
from tests.common.reference import ReferenceTrainer, SGDMomentum
from trainkit import TrainingWrapper

WEIGHTS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
WINDOWS = 4
BAD_WINDOW = 1


def bn_wrapper(**kwargs):
    net = TinyMLP(batch_norm=True)
    opt = nn.Adam(net.trainable_params(), learning_rate=0.05)
    return net, opt, TrainingWrapper(loss_network(net), opt, ema_decay=0.5, **kwargs)


def wrapper_state(wrapper):
    """Every Parameter of the wrapper but the window bookkeeping that moves with each window: the guard's
    ``_window_start.*``, and the sums ``_grad_sum.*``/``_loss_sum`` that a window's first micro-batch overwrites."""
    return {p.name: p.asnumpy().copy() for p in wrapper.get_parameters()
            if not p.name.startswith(("_window_start.", "_grad_sum.", "_loss_sum"))}


def planted(k, value, position):
    """WINDOWS windows of k micro-batches; micro-batch `position` of window BAD_WINDOW holds `value`."""
    data = batches(WINDOWS * k, 4, seed=2)
    data[BAD_WINDOW * k + position][0][1, 2] = value
    return data


@pytest.mark.parametrize("k,position,value,compute_grad_norm", [
    (1, 0, np.nan, False),   # all_finite over the gradients
    (1, 0, np.inf, True),    # isfinite of the gradient norm
    (3, 1, np.nan, True),    # the window's middle micro-batch: the whole window goes
    (3, 0, np.inf, False),
], ids=["k1-nan", "k1-inf-norm", "k3-nan-middle-norm", "k3-inf-first"])
def test_a_planted_window_leaves_no_trace_and_the_run_equals_one_that_never_saw_it(mode, k, position, value,
                                                                                   compute_grad_norm):
    data = planted(k, value, position)
    net, opt, wrapper = bn_wrapper(accumulation_steps=k, skip_nonfinite=True, compute_grad_norm=compute_grad_norm)
    outputs = []
    for window in range(WINDOWS):
        before = wrapper_state(wrapper)
        outputs += run(wrapper, data[window * k:(window + 1) * k])
        if window == BAD_WINDOW:
            after = wrapper_state(wrapper)
            assert after.keys() == before.keys()
            for name, value_before in before.items():  # weights, moments, EMA, moving statistics, counters
                np.testing.assert_array_equal(after[name], value_before, err_msg=name)
    overflows = [bool(o[1]) for o in outputs]
    assert overflows == [i == (BAD_WINDOW + 1) * k - 1 for i in range(WINDOWS * k)]
    assert int(opt.global_step.asnumpy()) == WINDOWS - 1
    assert int(wrapper.ema.num_updates.asnumpy()) == WINDOWS - 1
    moving = weights_of(net)["bn.moving_mean"]
    assert np.all(np.isfinite(moving)) and not np.allclose(moving, 0)  # the statistics are covered: they moved

    # The bare step (guard off) on the data without the planted window reaches the same state.
    clean = data[:BAD_WINDOW * k] + data[(BAD_WINDOW + 1) * k:]
    _, clean_opt, bare = bn_wrapper(accumulation_steps=k, compute_grad_norm=compute_grad_norm)
    run(bare, clean)
    got, expected = wrapper_state(wrapper), wrapper_state(bare)
    assert set(expected) <= set(got)
    for name, value_expected in expected.items():
        np.testing.assert_allclose(got[name], value_expected, rtol=1e-6, atol=1e-7, err_msg=name)


def test_skipped_windows_match_the_numpy_reference(mode):
    """No batch norm: the whole run against tests/common/reference.py, which skips windows that are not finite."""
    k = 2
    data = batches(5 * k, 3, seed=4)
    data[3][0][0, 1] = np.nan  # second window
    data[6][0][2, 0] = -np.inf  # fourth window
    net = TinyMLP()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    wrapper = TrainingWrapper(loss_network(net), opt, accumulation_steps=k, max_grad_norm=0.5, skip_nonfinite=True)
    ref = ReferenceTrainer(initial_weights(), SGDMomentum(0.1, 0.9), accumulation_steps=k, max_grad_norm=0.5)
    outputs = run(wrapper, data)
    for x, y in data:
        ref.micro_step(x, y)
    assert [bool(o[1]) for o in outputs] == ref.overflows
    assert ref.overflows == [False, False, False, True, False, False, False, True, False, False]
    assert [float(o[2]) for o in outputs] == [1.0] * len(data)  # no loss scaling
    got = weights_of(net)
    for name in WEIGHTS:
        np.testing.assert_allclose(got[name], ref.params[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert int(opt.global_step.asnumpy()) == ref.optimizer_steps == 3


def test_guard_off_is_the_bare_step(mode):
    """Without the guard nothing is checked: the NaN reaches the weights and overflow stays False, as before."""
    data = batches(3, 3, seed=5)
    data[1][0][0, 0] = np.nan
    net = TinyMLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    wrapper = TrainingWrapper(loss_network(net), opt)
    assert not wrapper.skip_nonfinite and wrapper.moving_statistics == ()
    outputs = run(wrapper, data)
    assert [bool(o[1]) for o in outputs] == [False, False, False]
    assert np.isnan(weights_of(net)["fc2.bias"]).all()


def test_guard_adds_no_state_for_one_micro_batch_windows():
    """With k=1 the guard keeps its copy of the statistics inside the step: a checkpoint has the same keys."""
    _, _, guarded = bn_wrapper(skip_nonfinite=True)
    _, _, bare = bn_wrapper()
    assert sorted(p.name for p in guarded.get_parameters()) == sorted(p.name for p in bare.get_parameters())
    assert [p.name for p in guarded.moving_statistics] == ["bn.moving_mean", "bn.moving_variance"]


class LossWithUntrainedTerm(nn.Cell):
    """Cross-entropy plus a term without gradient that is NaN when the batch's first label is 2: a non-finite
    loss with finite gradients."""

    def __init__(self, network):
        super().__init__()
        self.loss = loss_network(network)

    def construct(self, x, y):
        flag = ops.stop_gradient((y[0] == 2).astype(x.dtype))
        return self.loss(x, y) + ops.stop_gradient(ops.log(1.0 - flag) * 0.0)  # 0 * -inf = NaN


@pytest.mark.parametrize("k", [1, 2])
def test_a_non_finite_loss_with_finite_gradients_is_skipped(mode, k):
    data = batches(3 * k, 3, seed=6)
    for i, (_, y) in enumerate(data):
        y[0] = 2 if i == k else 0  # the first micro-batch of the second window
    net = TinyMLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    wrapper = TrainingWrapper(LossWithUntrainedTerm(net), opt, accumulation_steps=k, skip_nonfinite=True)
    outputs = run(wrapper, data)
    assert np.isnan(outputs[k][0])
    assert [bool(o[1]) for o in outputs] == [i == 2 * k - 1 for i in range(3 * k)]
    assert int(opt.global_step.asnumpy()) == 2
    assert all(np.all(np.isfinite(v)) for v in weights_of(net).values())


def test_loss_scaling_protects_the_moving_statistics_too(mode):
    net, _, wrapper = bn_wrapper(loss_scale=2.0 ** 8)
    data = batches(2, 4, seed=7)
    run(wrapper, data[:1])
    before = weights_of(net)
    data[1][0][0, 0] = np.nan
    outputs = run(wrapper, data[1:])
    assert bool(outputs[0][1])
    for name in ("bn.moving_mean", "bn.moving_variance"):
        np.testing.assert_array_equal(weights_of(net)[name], before[name])


class LossWithSideStatistics(nn.Cell):
    """Cross-entropy, and a batch norm beside the network whose output is not used: when the batch's first label
    is 2 its input is scaled by 1e30, so its moving variance overflows to inf while the loss and every gradient
    stay finite. Only the guard's check of the moving statistics can catch that step."""

    def __init__(self, network):
        super().__init__()
        self.loss = loss_network(network)
        self.side = nn.BatchNorm1d(4, momentum=0.5)

    def construct(self, x, y):
        flag = ops.stop_gradient((y[0] == 2).astype(x.dtype))
        unused = self.side(ops.stop_gradient(x * (1.0 + flag * 1e30)))
        return ops.depend(self.loss(x, y), unused)


def test_non_finite_moving_statistics_alone_skip_the_step_and_are_put_back(mode):
    data = batches(3, 4, seed=8)
    for i, (_, y) in enumerate(data):
        y[0] = 2 if i == 1 else 0
    net = TinyMLP()
    loss = LossWithSideStatistics(net)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    wrapper = TrainingWrapper(loss, opt, skip_nonfinite=True, compute_grad_norm=True)
    run(wrapper, data[:1])
    before = {**weights_of(net), **weights_of(loss.side)}
    outputs = run(wrapper, data[1:2])
    assert np.isfinite(outputs[0][0]) and np.isfinite(outputs[0][3])  # loss and gradient norm: finite
    assert bool(outputs[0][1])  # skipped
    after = {**weights_of(net), **weights_of(loss.side)}
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert int(opt.global_step.asnumpy()) == 1
    run(wrapper, data[2:])  # the next step applies from the restored statistics
    assert int(opt.global_step.asnumpy()) == 2
    assert all(np.all(np.isfinite(v)) for v in weights_of(loss.side).values())
