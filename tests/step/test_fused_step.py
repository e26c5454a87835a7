"""The wrapper's fused optimizer step (one kernel call with the gradient factor and the finite flag, no branch in
the graph) is bitwise the step it replaces (MindSpore's nn.Momentum behind the guard's branch, with
TRAINKIT_FUSED_KERNELS=0), every feature on, a non-finite window planted; and it is taken only where it stands
for the same arithmetic."""

import functools

import mindspore as ms
import numpy as np
import pytest
from mindspore import amp, nn, ops

from tests.common.kernels import needs_compiler
from tests.common.models import TinyMLP, batches, loss_network, run
from trainkit import TrainingWrapper

pytestmark = needs_compiler


@pytest.mark.parametrize("accumulation_steps", [1, 2, 3])
def test_every_feature_on_with_a_skipped_window_is_bitwise_the_branch_it_replaces(mode, shared_cache, monkeypatch,
                                                                                    accumulation_steps):
    """Weights, moments, step counter, EMA shadows and counters, moving statistics, loss scale and running totals
    after 5 windows (the second not finite) are the same bits on both paths: the branch here is MindSpore's
    nn.Momentum behind the guard's ``if`` (a subclass overriding ``apply_grads`` keeps it), with the kernels' norm
    as the fused side has it. Mutations caught: the EMA updated on the skipped window (``update_if(self._true)``);
    the moving statistics not restored (the restore call dropped). With accumulation the fused side is also the
    window with no branch (``accumulate_all``, whose output is the window's norm); its ``_grad_sum``, ``_loss_sum``
    are scratch (the next window's first micro-step overwrites them): not compared. Without the kernels at all
    (``TRAINKIT_FUSED_KERNELS=0``: the norm a float32 sum of squares by MindSpore's kernels) the same to a rounding
    of the norm."""
    data = batches(5 * accumulation_steps, 4, seed=4)
    data[accumulation_steps][0][0, 1] = np.nan  # the second window

    def train(kind: str):
        if kind == "no kernels":
            monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
        wrapper = (Branch if kind == "branch" else TrainingWrapper)(**everything_on_kwargs(accumulation_steps))
        assert (wrapper.fused_update is not None) == (kind == "fused")
        assert (wrapper.accumulate_all is not None) == (kind == "fused" and accumulation_steps > 1)
        assert (wrapper.norm_all is not None) == (kind != "no kernels")
        outputs = run(wrapper, data)
        monkeypatch.delenv("TRAINKIT_FUSED_KERNELS", raising=False)
        return outputs, {p.name: p.asnumpy() for p in wrapper.get_parameters()}

    fused_outputs, fused = train("fused")
    assert [bool(o[1]) for o in fused_outputs] == [i == 2 * accumulation_steps - 1
                                                  for i in range(5 * accumulation_steps)]
    assert int(fused["global_step"][0]) == 4 and int(fused["ema_num_updates"]) == 2
    for kind in ("branch", "no kernels"):
        reference_outputs, reference = train(kind)
        compare = np.testing.assert_array_equal if kind == "branch" else functools.partial(
            np.testing.assert_allclose, rtol=1e-5, atol=1e-7)
        for got, expected in zip(fused_outputs, reference_outputs):
            for a, b in zip(got, expected):
                compare(a, b)
        assert fused.keys() == reference.keys()
        for name, value in reference.items():
            if not name.startswith(("_grad_sum.", "_loss_sum")):
                compare(fused[name], value, err_msg=f"{kind}: {name}")


def everything_on_kwargs(accumulation_steps: int) -> dict:
    ms.set_seed(0)
    net = TinyMLP(batch_norm=True)
    optimizer = nn.Momentum(net.trainable_params(), [0.1, 0.08, 0.06, 0.04, 0.02, 0.01], 0.9, weight_decay=1e-3)
    return dict(network=loss_network(net), optimizer=optimizer, loss_scale=amp.DynamicLossScaler(2.0 ** 10, 2, 3),
                max_grad_norm=0.5, accumulation_steps=accumulation_steps, ema_decay=0.8, ema_warmup=True, ema_every=2,
                metrics_on_device=True)


class Branch(TrainingWrapper):
    """``apply_grads`` as the wrapper's own, overridden: MindSpore's optimizer behind the guard's branch."""

    def apply_grads(self, grads):
        applied = self.optimizer(grads)
        if self.ema is not None:
            applied = ops.depend(self.ema(), applied)
        return applied


class OwnApply(TrainingWrapper):
    def apply_grads(self, grads):
        return self.optimizer(grads)


def test_taken_only_where_it_stands_for_the_same_arithmetic(shared_cache, graph_mode, monkeypatch):
    """A subclass overriding a phase the call stands for, an optimizer the kernels do not repeat, and a machine
    without the kernels all keep MindSpore's optimizer behind the branch."""
    assert TrainingWrapper(**everything_on_kwargs(1)).fused_update is not None
    assert OwnApply(**everything_on_kwargs(1)).fused_update is None
    net = TinyMLP()
    assert TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), 0.1)).fused_update is None
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    assert TrainingWrapper(**everything_on_kwargs(1)).fused_update is None
