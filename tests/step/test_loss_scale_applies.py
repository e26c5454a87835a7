"""Loss scaling multiplies the loss and divides the gradients: shown where it changes the result.

Power-of-two scales in float32 leave gradients bit-identical whether or not they are applied, so these two
cases are built where applying the scale matters (seed 001: float16 gradients below ~6e-8 underflow):

* float16 (``amp`` O3): true gradients of 1e-9 to 1e-8 flush to zero in float16 without a scale; with
  2**16 they survive and the float32 master weights move by the NumPy amount;
* float32: a loss whose gradient times the initial scale passes 3.4e38 overflows, so the wrapper must skip
  and back off in exactly the sequence computed here.
"""
import mindspore as ms
import numpy as np
from mindspore import amp, nn

from tests.common.models import LinearLoss, TinyMLP, batches, initial_weights, run, weights_of
from tests.common.reference import mlp_loss_and_grads
from trainkit import TrainingWrapper
from trainkit.step.mixed_precision import build_loss_network

TINY = 2.0 ** -27  # the loss factor: gradients of 1e-9 to 1e-8
FLOAT16_SMALLEST_HALF = 2.0 ** -25  # half float16's smallest subnormal: anything smaller rounds to 0
FLOAT32_MAX = float(np.finfo(np.float32).max)
LR = 2.0 ** 20  # large enough that a 1e-9 gradient moves a float32 weight of ~0.3 visibly


class TinyCrossEntropy(nn.Cell):
    """Softmax cross-entropy times TINY: a loss whose gradients lie below float16's range."""

    def __init__(self):
        super().__init__()
        self.cross_entropy = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, label):
        return self.cross_entropy(logits, label) * TINY


def float16_update(loss_scale):
    """One SGD step of TinyMLP cast to float16 (O3) on the tiny loss; returns (before, after) float32 weights."""
    net = TinyMLP()
    loss_net = build_loss_network(net, TinyCrossEntropy(), "O3")
    wrapper = TrainingWrapper(loss_net, nn.SGD(net.trainable_params(), learning_rate=LR), loss_scale=loss_scale)
    before = weights_of(net)
    run(wrapper, batches(1, 8, seed=3))
    return before, weights_of(net)


def expected_float16_update():
    x, y = batches(1, 8, seed=3)[0]
    params = {k: v.astype(np.float64) for k, v in initial_weights().items()}
    _, grads = mlp_loss_and_grads(params, x, y)
    return {k: -LR * TINY * g for k, g in grads.items()}, grads


def test_float16_gradients_survive_with_a_scale_and_the_master_weights_move_by_the_numpy_amount(mode):
    expected, grads = expected_float16_update()
    true_grads = np.concatenate([TINY * g.ravel() for g in grads.values()])
    assert np.median(np.abs(true_grads)) > 1e-10 and np.max(np.abs(true_grads)) < 2e-8  # below float16's range
    before, after = float16_update(amp.StaticLossScaler(2.0 ** 16))
    assert all(value.dtype == np.float32 for value in after.values())  # master weights
    for name, update in expected.items():
        moved = after[name].astype(np.float64) - before[name]
        # float16 compute: ~1e-3 relative per value; a scale not applied gives 0, not divided gives 65536x
        np.testing.assert_allclose(moved, update, rtol=5e-2, atol=2e-2 * np.abs(update).max(), err_msg=name)


def test_float16_gradients_underflow_to_zero_without_a_scale(mode):
    _, grads = expected_float16_update()
    x, y = batches(1, 8, seed=3)[0]
    # The gradient entering the float16 network, d(TINY * loss)/d logits, is below half float16's smallest
    # subnormal everywhere: float16 rounds all of it to 0, so nothing can move.
    logits_grad_bound = TINY / len(y)  # |softmax - onehot| / n <= 1 / n
    assert logits_grad_bound < FLOAT16_SMALLEST_HALF
    before, after = float16_update(None)
    for name in grads:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_float32_scaled_loss_overflows_and_the_scale_backs_off_as_computed(mode):
    x = np.array([[3000.0, -1000.0, 500.0, 1500.0]], np.float32)
    w0 = np.array([[0.5, -0.25, 0.75, 1.0]], np.float32)
    initial, factor, window, lr, steps = 2.0 ** 127, 16, 2, 1e-4, 10
    assert float(x.astype(np.float64) @ w0.T.astype(np.float64)) * initial > FLOAT32_MAX

    # The test's own arithmetic: the scaled gradient scale * x overflows float32 or it does not (never close).
    scale, good, scales, overflows, applied = initial, 0, [], [], 0
    for _ in range(steps):
        largest = scale * np.abs(x).max()
        assert largest > 2 * FLOAT32_MAX or largest < FLOAT32_MAX / 2
        overflow = largest > FLOAT32_MAX
        scales.append(scale)
        overflows.append(overflow)
        if overflow:
            scale, good = max(1.0, scale / factor), 0
        else:
            applied += 1
            good += 1
            if good == window:
                scale, good = scale * factor, 0
    assert overflows == [True, True, True, False, False, True, False, False, True, False]

    loss_net = LinearLoss(w0)
    optimizer = nn.SGD(loss_net.trainable_params(), learning_rate=lr)
    wrapper = TrainingWrapper(loss_net, optimizer, loss_scale=amp.DynamicLossScaler(initial, factor, window))
    wrapper.set_train()
    outputs = [wrapper(ms.Tensor(x)) for _ in range(steps)]
    assert [bool(o[1].asnumpy()) for o in outputs] == overflows
    assert [float(o[2].asnumpy()) for o in outputs] == scales
    assert float(wrapper.loss_scale_value.asnumpy()) == scale
    assert int(optimizer.global_step.asnumpy()) == applied
    np.testing.assert_allclose(loss_net.dense.weight.asnumpy(), w0 - lr * applied * x, rtol=1e-6)


def test_the_reference_applies_the_scale_too():
    """tests/common/reference.py multiplies, then divides: exact for 2**60; past float32's 3.4e38, inf."""
    x, y = batches(1, 8, seed=3)[0]
    params = {k: v.astype(np.float64) for k, v in initial_weights().items()}
    _, plain = mlp_loss_and_grads(params, x, y)
    _, scaled = mlp_loss_and_grads(params, x, y, sens=2.0 ** 60)
    for name, grad in plain.items():
        np.testing.assert_array_equal(scaled[name], grad * 2.0 ** 60, err_msg=name)
    _, overflowed = mlp_loss_and_grads(params, x, y, sens=1e42)
    assert not any(np.all(np.isfinite(g)) for g in overflowed.values())
