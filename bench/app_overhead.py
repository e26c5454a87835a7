"""Row 4: the whole app (`python -m trainkit`'s `trainkit.app.training.train`) against a bare `Model.train` script.

Steps/s are taken in steady state, from the step-10 record to the last one, on both sides: the first steps hold
the compilation, reported apart (it is row 8's business) along with each side's whole `Model.train` time.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Accuracy, Callback, Model

from bench.common import Row, Settings, alternate, ratio, setup
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.data.digits import DigitsData
from trainkit.models import SmallCNN

LR = 0.01
EVERY = 10  # steps between the records both sides' rates are read from (the app's logger.log_every_n_steps)

#: The wrapper's step as the bare loop's: the app's default guard and gradient-norm logging off (rows 1-2 time them).
BARE_STEP = ["wrapper.skip_nonfinite=false", "wrapper.compute_grad_norm=false"]


def _steady_rate(records: List[Dict[str, float]]) -> float:
    """Steps/s between the first and the last (step, time) record."""
    first, last = records[0], records[-1]
    return (last["step"] - first["step"]) / (last["time"] - first["time"])


def _app(run_dir: Path, epochs: int, *overrides: str) -> Dict[str, float]:
    """The quick-start recipe with a constant learning rate and no EMA, evaluating once at the end.

    Everything else is on as a user gets it: progress, metrics file, TensorBoard, checkpoints and best.ckpt.
    """
    cfg = compose_config(["recipe=digits_quickstart", f"trainer.epochs={epochs}", "trainer.eval_interval=0",
                          "lr_schedule=constant", "lr_schedule.warmup_epochs=0", f"optimizer.lr={LR}",
                          "wrapper.ema_decay=null", "logger.progress=log", f"logger.log_every_n_steps={EVERY}",
                          f"run_dir={run_dir}", *overrides])
    seconds = train(cfg).metrics["train_seconds"]
    with open(run_dir / "metrics.jsonl") as lines:
        records = [r for r in map(json.loads, lines) if "train/loss" in r]
    return {"rate": _steady_rate(records), "seconds": seconds}


class _StepTimes(Callback):
    """(step, time) every EVERY steps: the one thing the bare script adds, to be measured the same way."""

    def __init__(self):
        self.records: List[Dict[str, float]] = []

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if step % EVERY == 0:
            self.records.append({"step": step, "time": time.time()})


def _bare(epochs: int) -> Dict[str, float]:
    """What a user writes without trainkit: the same network, optimizer and data, Model.train then Model.eval."""
    ms.set_seed(0)
    ds.config.set_fast_recovery(False)  # as the app's default (trainer.resume_data=exact): the same data pipeline
    data = DigitsData(batch_size=32)
    data.prepare()
    network = SmallCNN(num_classes=10, in_channels=1)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Adam(network.trainable_params(), learning_rate=LR, weight_decay=0.0)
    model = Model(network, loss, optimizer, metrics={"accuracy": Accuracy()})
    times = _StepTimes()
    start = time.perf_counter()
    model.train(epochs, data.train_dataset(), callbacks=[times], dataset_sink_mode=False)
    model.eval(data.eval_dataset(), dataset_sink_mode=False)
    return {"rate": _steady_rate(times.records), "seconds": time.perf_counter() - start}


def run(settings: Settings) -> List[Row]:
    epochs = settings.app_epochs
    results: Dict[str, List[Dict[str, float]]] = {"app": [], "bare": [], "app_default": []}
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-app-") as folder:
        runs = iter(range(10 ** 6))
        alternate({
            "app": lambda: results["app"].append(_app(Path(folder) / f"run{next(runs)}", epochs, *BARE_STEP)),
            "bare": lambda: results["bare"].append(_bare(epochs)),
            "app_default": lambda: results["app_default"].append(_app(Path(folder) / f"run{next(runs)}", epochs)),
        }, settings.reps)
    # ratio() divides the first side's numbers by the second's: give it seconds per step.
    per_step = {side: [1 / r["rate"] for r in runs_] for side, runs_ in results.items()}
    steps = epochs * DigitsData(batch_size=32).train_dataset().get_dataset_size()

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    times = (f"{steps} steps ({epochs} epochs); steady steps/s: app {median('app', 'rate'):.0f}, bare "
             f"{median('bare', 'rate'):.0f}, app with its default wrapper {median('app_default', 'rate'):.0f}; "
             f"whole Model.train with compile and one evaluation: app {median('app', 'seconds'):.2f} s, bare "
             f"{median('bare', 'seconds'):.2f} s, app default {median('app_default', 'seconds'):.2f} s")
    where = setup("small_cnn (digits recipe)", 32, 8, optimizer="adam", epochs=epochs)
    value, spread = ratio(per_step, "bare", "app")  # seconds per step bare / app = steps/s app / bare
    default, default_spread = ratio(per_step, "bare", "app_default")
    return [Row("4", "steps/s, app (python -m trainkit) / bare Model.train", value, "x", ">= 0.95", value >= 0.95,
                spread, times + "; app with " + " ".join(BARE_STEP), where),
            Row("4", "steps/s, app with default wrapper (guard, grad-norm logging) / bare Model.train", default, "x",
                ">= 0.95", default >= 0.95, default_spread, times, where)]
