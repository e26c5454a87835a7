"""The accumulation window's moving statistics with and without their branch (issue 52), alternating in one process.

``python -m bench.window_ab [reps] [windows] [model]`` (defaults 9, 2, resnet50). Row 3's "everything at once"
(dynamic loss scale, clipping, EMA, 4 micro-batches of 8 at 32x32) with ``nn.SGD(momentum=0.9)``, an optimizer the
fused step does not repeat, so MindSpore's optimizer runs behind the guard's ``if finite``:

* ``before``: the statistics as they were kept until this change, by a subclass with the former
  ``save_moving_statistics`` (``if micro_step == 0:`` an assign per tensor into ``_window_start``) and
  ``restore_moving_statistics`` (an assign per tensor in the guard's ``else``); overriding them keeps that form;
* ``after``: ``TrainingWrapper`` itself: one kernel call with a flag each way, no branch of their own;
* ``bare micro``: ``nn.TrainOneStepCell`` on a micro-batch, the row's denominator.

Row 3's own sides (``nn.Momentum``: the fused window) are not here: their statistics already took one kernel call
each way. Prints medians per micro-step, the ratios of paired repetitions with their spread, and the load average
at the start and the end. Nothing is asserted.
"""
from __future__ import annotations

import os
import statistics
import sys

import mindspore as ms
from mindspore import nn

from bench.common import Stepper, alternate_blocks, batch_tensors, loss_network, median_ms, ratio
from bench.peer_features import DECAY, MAX_NORM, SCALE, SCALE_WINDOW, K
from trainkit import TrainingWrapper
from trainkit.step.grad_ops import copied, restore_into

MICRO, IMAGE = 8, 32


class StatisticsBeforeIssue52(TrainingWrapper):
    """The moving statistics saved and put back as the wrapper did before: per tensor, inside graph ``if``s."""

    def save_moving_statistics(self) -> tuple:
        if not self.guard_moving_statistics:
            return ()
        if self.accumulation_steps == 1:
            return self.hyper_map(copied, self.moving_statistics)
        if self.micro_step == 0:
            self.hyper_map(restore_into, self._window_start, self.moving_statistics)
        return self._window_start

    def restore_moving_statistics(self, statistics: tuple) -> None:
        if self.guard_moving_statistics:
            self.hyper_map(restore_into, self.moving_statistics, statistics)


def _backbone(model: str) -> nn.Cell:
    from trainkit.models import SmallCNN, resnet18, resnet50

    builders = {"resnet50": resnet50, "resnet18": resnet18,
                "small_cnn": lambda num_classes: SmallCNN(num_classes=num_classes, in_channels=3)}
    return builders[model](num_classes=10)


def _step(model: str, kind: str, warmup: int) -> Stepper:
    ms.set_seed(0)
    backbone = _backbone(model)
    optimizer = nn.SGD(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)
    if kind == "bare micro":
        cell = nn.TrainOneStepCell(loss_network(backbone), optimizer)
    else:
        wrapper = StatisticsBeforeIssue52 if kind == "before" else TrainingWrapper
        cell = wrapper(loss_network(backbone), optimizer, loss_scale=ms.amp.DynamicLossScaler(SCALE, 2, SCALE_WINDOW),
                       max_grad_norm=MAX_NORM, ema_decay=DECAY, accumulation_steps=K)
        assert cell.fused_update is None and (cell.restore_statistics_unless is None) == (kind == "before"), kind
    return Stepper(cell, batch_tensors(MICRO, 3, IMAGE), warmup)


def main(reps: int = 9, windows: int = 2, model: str = "resnet50") -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    print("load average at start", os.getloadavg(), flush=True)
    steppers = {kind: _step(model, kind, warmup=2 * K) for kind in ("bare micro", "before", "after")}
    for kind, stepper in steppers.items():
        print(f"{kind}: compiled in {stepper.compile_seconds:.1f} s", flush=True)
    calls = K * windows
    seconds = alternate_blocks({"mindspore": {kind: stepper.run(calls) for kind, stepper in steppers.items()}}, reps)
    for kind, values in seconds.items():
        print(f"{kind}: median {median_ms(values, calls)} a micro-step (min {min(values) / calls * 1000:.1f} ms)")
    for numerator, denominator in (("after", "before"), ("before", "bare micro"), ("after", "bare micro")):
        value, spread = ratio(seconds, numerator, denominator)
        print(f"{numerator} / {denominator}: median {value:.3f}x (pairs {spread})")
    print(f"{model}, micro-batch {MICRO} at {IMAGE}x{IMAGE}, {calls} micro-steps a repetition, "
          f"{statistics.median([len(v) for v in seconds.values()])} repetitions")
    print("load average at end", os.getloadavg())


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(*(int(a) for a in arguments[:2]), *arguments[2:3])
