"""What row 4's gap is made of (issue 33): the callbacks' time per hook, and the default wrapper's features per step.

`python -m bench.loop_costs [--epochs 12] [--reps 15]`:

1. runs row 4's app side (``bench.app_overhead._app``: the quick start as a user gets it, the default wrapper) once
   with a timer around every hook of every callback the app builds, and prints each hook's total and its share per
   training step (the hooks run inside ``Model.train``'s loop, between the steps);
2. times the quick start's cell alone (small CNN, Adam, one fixed batch) as ``nn.TrainOneStepCell`` (what a bare
   ``Model.train`` builds) and as TrainingWrapper with the app's features one by one -- running totals, gradient
   norm, the non-finite guard, both (the app's default) -- the sides alternating, and prints ms per step.

Run it from a copy of the tree (``git archive HEAD | tar -x -C /tmp/snap``): MindSpore reads ``construct``'s source
when it compiles.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

import mindspore as ms
from mindspore import nn

import trainkit.app.build as build
from bench.app_overhead import _app
from bench.common import Stepper, alternate, batch_tensors, loss_network
from trainkit import TrainingWrapper
from trainkit.models import SmallCNN

HOOKS = ("on_train_epoch_begin", "on_train_step_begin", "on_train_step_end", "on_train_epoch_end")


def callback_costs(epochs: int) -> None:
    """Row 4's app run with every callback hook timed; prints the hooks that cost, per step."""
    spent: Dict[tuple, float] = collections.defaultdict(float)
    calls: Dict[tuple, int] = collections.Counter()
    build_callbacks = build.build_callbacks

    def timed_callbacks(*args, **kwargs):
        built = build_callbacks(*args, **kwargs)
        for callback in built.callbacks:
            for hook in HOOKS:
                setattr(callback, hook, timer(getattr(callback, hook), (type(callback).__name__, hook)))
        return built

    def timer(call: Callable, key: tuple) -> Callable:
        def timed(run_context):
            start = time.perf_counter()
            try:
                return call(run_context)
            finally:
                spent[key] += time.perf_counter() - start
                calls[key] += 1
        return timed

    build.build_callbacks = timed_callbacks
    try:
        with tempfile.TemporaryDirectory(prefix="trainkit-loop-costs-") as folder:
            _app(Path(folder) / "warm", 1)  # imports and the compile cache: not what is measured
            spent.clear()
            calls.clear()
            result = _app(Path(folder) / "run", epochs)
    finally:
        build.build_callbacks = build_callbacks
    steps = max(count for (_, hook), count in calls.items() if hook == "on_train_step_end")
    print(f"app, {steps} steps: {result['rate']:.0f} steps/s in the steady state; load average {os.getloadavg()}")
    for (name, hook), seconds in sorted(spent.items(), key=lambda item: -item[1]):
        if seconds / steps >= 2e-6:
            print(f"  {name:20s} {hook:22s} {calls[(name, hook)]:5d} calls {seconds * 1e3:8.2f} ms "
                  f"{seconds / steps * 1e6:8.1f} us/step")
    total = sum(seconds for (name, hook), seconds in spent.items() if name != "Evaluation")
    print(f"  all hooks but the evaluation: {total / steps * 1e6:.0f} us/step")


def wrapper_costs(reps: int, steps: int = 50) -> None:
    """The quick start's cell with the app's wrapper features one by one against TrainOneStepCell."""
    images, labels = batch_tensors(32, 1, 8)

    def cell(**features) -> Callable[[], None]:
        ms.set_seed(0)
        backbone = SmallCNN(num_classes=10, in_channels=1)
        optimizer = nn.Adam(backbone.trainable_params(), learning_rate=0.01)
        if features.pop("bare", False):
            step = nn.TrainOneStepCell(loss_network(backbone), optimizer)
        else:
            step = TrainingWrapper(loss_network(backbone), optimizer, **features)
        return Stepper(step, (images, labels), warmup=5).run(steps)

    sides = {"TrainOneStepCell": cell(bare=True), "wrapper, features off": cell(),
             "+ running totals": cell(metrics_on_device=True),
             "+ totals, grad norm": cell(metrics_on_device=True, compute_grad_norm=True),
             "+ totals, guard": cell(metrics_on_device=True, skip_nonfinite=True),
             "app default (totals, norm, guard)": cell(metrics_on_device=True, compute_grad_norm=True,
                                                       skip_nonfinite=True)}
    seconds = alternate(sides, reps)
    base = seconds["TrainOneStepCell"]
    print(f"cell alone, {reps} x {steps} steps; load average {os.getloadavg()}")
    for name, values in seconds.items():
        ratios = [a / b for a, b in zip(values, base)]
        print(f"  {name:36s} {statistics.median(values) / steps * 1e3:6.3f} ms/step  "
              f"x{statistics.median(ratios):.3f} (pairs {min(ratios):.3f}-{max(ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    callback_costs(args.epochs)
    ms.set_context(mode=ms.GRAPH_MODE)
    wrapper_costs(args.reps)


if __name__ == "__main__":
    main()
