"""AMP levels O0-O3 train with the wrapper on CPU and track the float64 reference (what each level casts:
tests/test_amp_casts.py)."""
import numpy as np
import pytest
from mindspore import amp, nn

from tests.common.models import TinyMLP, batches, initial_weights, run, weights_of
from tests.common.reference import ReferenceTrainer, SGDMomentum
from trainkit import TrainingWrapper
from trainkit.step.mixed_precision import build_loss_network


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_amp_level_trains_with_dynamic_loss_scale(graph_mode, level):
    net = TinyMLP()
    loss_net = build_loss_network(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), level)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    wrapper = TrainingWrapper(loss_net, opt, loss_scale=amp.DynamicLossScaler(2.0 ** 12, 2, 100),
                              accumulation_steps=2, max_grad_norm=1.0)
    data = batches(12, 8, seed=21)
    outputs = run(wrapper, data)
    ref = ReferenceTrainer(initial_weights(), SGDMomentum(0.1, 0.9), accumulation_steps=2, max_grad_norm=1.0)
    for x, y in data:
        ref.micro_step(x, y)
    assert not any(bool(o[1]) for o in outputs)
    assert all(np.isfinite(o[0]) for o in outputs)
    got = weights_of(net)
    assert all(value.dtype == np.float32 for value in got.values())  # master weights stay float32
    tol = dict(rtol=1e-4, atol=1e-5) if level == "O0" else dict(rtol=2e-2, atol=3e-3)  # float16 compute
    for name, value in ref.params.items():
        np.testing.assert_allclose(got[name], value, err_msg=name, **tol)


def test_unknown_amp_level_is_rejected():
    with pytest.raises(ValueError, match="amp_level must be one of O0, O1, O2, O3"):
        build_loss_network(TinyMLP(), nn.MSELoss(), "O4")


def test_amp_o2_with_batch_norm_trains(mode):
    net = TinyMLP(batch_norm=True)
    loss_net = build_loss_network(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), "O2")
    wrapper = TrainingWrapper(loss_net, nn.Adam(net.trainable_params(), learning_rate=0.05),
                              loss_scale=amp.DynamicLossScaler(2.0 ** 10, 2, 50), ema_decay=0.9)
    x, y = batches(1, 16, seed=4)[0]
    losses = [o[0] for o in run(wrapper, [(x, y)] * 15)]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0]
    # That batch norm computes in float32 at O2 (not only stores float32) is tests/test_amp_casts.py's.
