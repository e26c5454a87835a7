"""The wrapper's fused optimizer step (one kernel call with the gradient factor and the finite flag, no branch in
the graph) is bitwise the step it replaces (MindSpore's nn.Momentum behind the guard's branch, with
TRAINKIT_FUSED_KERNELS=0), every feature on, a non-finite window planted; and it is taken only where it stands
for the same arithmetic."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import amp, nn

from tests.common.kernels import needs_compiler
from tests.common.models import TinyMLP, batches, loss_network, run
from trainkit import TrainingWrapper

pytestmark = needs_compiler


@pytest.mark.parametrize("accumulation_steps", [1, 2, 3])
def test_every_feature_on_with_a_skipped_window_is_bitwise_the_branch_it_replaces(mode, own_cache, monkeypatch,
                                                                                    accumulation_steps):
    """Weights, moments, step counter, EMA shadows and counters, moving statistics, loss scale and running totals
    after 5 windows (the second not finite) are the same bits on both paths. Mutations caught: the EMA updated
    on the skipped window (``update_if(self._true)``); the moving statistics not restored (the restore call
    dropped). With accumulation the fused side is also the window with no branch (``accumulate_all``); its
    ``_grad_sum``, ``_loss_sum`` are scratch (the next window's first micro-step overwrites them): not compared."""
    data = batches(5 * accumulation_steps, 4, seed=4)
    data[accumulation_steps][0][0, 1] = np.nan  # the second window

    def train(fused: bool):
        if not fused:
            monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
        wrapper = TrainingWrapper(**everything_on_kwargs(accumulation_steps))
        assert (wrapper.fused_update is not None) == fused
        assert (wrapper.accumulate_all is not None) == (fused and accumulation_steps > 1)
        outputs = run(wrapper, data)
        monkeypatch.delenv("TRAINKIT_FUSED_KERNELS", raising=False)
        return outputs, {p.name: p.asnumpy() for p in wrapper.get_parameters()}

    reference_outputs, reference = train(False)
    fused_outputs, fused = train(True)
    assert [bool(o[1]) for o in fused_outputs] == [i == 2 * accumulation_steps - 1
                                                  for i in range(5 * accumulation_steps)]
    for got, expected in zip(fused_outputs, reference_outputs):
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    assert fused.keys() == reference.keys()
    assert int(fused["global_step"][0]) == 4 and int(fused["ema_num_updates"]) == 2
    for name, value in reference.items():
        if not name.startswith(("_grad_sum.", "_loss_sum")):
            np.testing.assert_array_equal(fused[name], value, err_msg=name)


def everything_on_kwargs(accumulation_steps: int) -> dict:
    ms.set_seed(0)
    net = TinyMLP(batch_norm=True)
    optimizer = nn.Momentum(net.trainable_params(), [0.1, 0.08, 0.06, 0.04, 0.02, 0.01], 0.9, weight_decay=1e-3)
    return dict(network=loss_network(net), optimizer=optimizer, loss_scale=amp.DynamicLossScaler(2.0 ** 10, 2, 3),
                max_grad_norm=0.5, accumulation_steps=accumulation_steps, ema_decay=0.8, ema_warmup=True, ema_every=2,
                metrics_on_device=True)


class OwnApply(TrainingWrapper):
    def apply_grads(self, grads):
        return self.optimizer(grads)


def test_taken_only_where_it_stands_for_the_same_arithmetic(own_cache, graph_mode, monkeypatch):
    """A subclass overriding a phase the call stands for, an optimizer the kernels do not repeat, and a machine
    without the kernels all keep MindSpore's optimizer behind the branch."""
    assert TrainingWrapper(**everything_on_kwargs(1)).fused_update is not None
    assert OwnApply(**everything_on_kwargs(1)).fused_update is None
    net = TinyMLP()
    assert TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), 0.1)).fused_update is None
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    assert TrainingWrapper(**everything_on_kwargs(1)).fused_update is None
