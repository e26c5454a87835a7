"""EarlyStopping against scripted sequences of evaluation results, then in a run: it ends the run, the run reports
its best epoch and is finished for ``trainer.resume=auto``."""
import json
import logging
import math
import re

import pytest

from tests.common.callbacks import read_jsonl
from tests.common.cifar10_files import write_cifar10
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.callbacks.early_stopping import EarlyStopping
from trainkit.errors import ConfigError


class ScriptedEvaluation:
    """Stands for an Evaluation callback: its ``history`` grows by one scripted result per epoch."""

    metric_names = ["eval/accuracy", "eval/loss"]

    def __init__(self):
        self.history = []


class Context:
    def __init__(self):
        self.stop_requested = False

    def request_stop(self):
        self.stop_requested = True


def epochs_until_stop(callback, evaluation, values, metric):
    """Feed one result per epoch; the epoch after which the callback asked to stop, or None."""
    context = Context()
    for epoch, value in enumerate(values, start=1):
        evaluation.history.append({"epoch": epoch, "step": 10 * epoch, metric: value})
        callback.on_train_epoch_end(context)
        if context.stop_requested:
            return epoch
    return None


@pytest.mark.parametrize("values, mode, patience, min_delta, stop, best_epoch", [
    # best 1.0 (e1), 0.8 (e2, -0.2); 0.85 worse (1); 0.79 better by only 0.01 <= 0.02 (2); 0.80 (3): stop after e5
    ([1.0, 0.8, 0.85, 0.79, 0.80, 0.5], "min", 3, 0.02, 5, 2),
    # the same values without min_delta: 0.79 improves (e4), then 0.80 (1), 0.5 improves: never stops
    ([1.0, 0.8, 0.85, 0.79, 0.80, 0.5], "min", 3, 0.0, None, 6),
    # accuracy: best 0.5 (e1), 0.6 (e2); NaN never improves (1), 0.6 is not > 0.6 (2): stop after e4
    ([0.5, 0.6, math.nan, 0.6, 0.9], "max", 2, 0.0, 4, 2),
    # patience 1: the first evaluation that does not improve stops
    ([0.3, 0.2, 0.1], "max", 1, 0.0, 2, 1),
])
def test_stops_after_patience_evaluations_without_improvement(values, mode, patience, min_delta, stop, best_epoch):
    metric = "eval/loss" if mode == "min" else "eval/accuracy"
    evaluation = ScriptedEvaluation()
    callback = EarlyStopping(evaluation, metric, mode=mode, patience=patience, min_delta=min_delta)
    assert epochs_until_stop(callback, evaluation, values, metric) == stop
    assert callback.best_epoch == best_epoch
    assert (callback.stopped is not None) == (stop is not None)


def test_bad_arguments_name_what_is_valid():
    evaluation = ScriptedEvaluation()
    with pytest.raises(ValueError, match="eval/loss"):
        EarlyStopping(evaluation, "eval/los")
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(evaluation, "eval/loss", patience=0)
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(evaluation, "eval/loss", mode="lower")


@pytest.mark.parametrize("change, message", [
    (["trainer.early_stopping.metric=los"], "trainer.early_stopping.metric='los' is not valid"),
    (["wrapper.ema_decay=null", "trainer.early_stopping.metric=ema_loss"], "needs EMA weights"),
    (["trainer.early_stopping.metric=loss", "trainer.early_stopping.patience=0"], "patience=0 is not valid"),
    (["trainer.early_stopping.metric=loss", "trainer.early_stopping.mode=lower"], "mode='lower' is not valid"),
])
def test_bad_config_values_stop_before_anything_runs(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        train(compose_config(["data=digits", *change, f"run_dir={tmp_path}"]))
    assert not (tmp_path / ".hydra").exists()


def test_an_early_stopped_run_reports_its_best_epoch_and_is_finished(tmp_path, caplog):
    """min_delta larger than any change: every evaluation after the first fails to improve, so patience 1 stops the
    run after epoch 2 of 3. Its progress lines show the loss metrics.jsonl holds for the same step."""
    root = tmp_path / "cifar10"
    write_cifar10(str(root), train_per_file=10, test_records=8, seed=5)
    run_dir = tmp_path / "run"
    config = ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", f"data.root={root}",
              "data.val_fraction=0.2", "data.image_size=8", "data.batch_size=8", "data.num_parallel_workers=1",
              "trainer.epochs=3", "logger.progress=log",
              "logger.log_every_n_steps=2", "trainer.early_stopping.metric=loss",
              "trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=1000", f"run_dir={run_dir}"]
    with caplog.at_level(logging.INFO, logger="trainkit"):
        result = train(compose_config(config))
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["epoch"] for r in records if "eval/loss" in r] == [1, 2]
    assert result.metrics["best_epoch"] == 1 and result.metrics["stopped_epoch"] == 2
    assert result.metrics["best_eval_loss"] == [r["eval/loss"] for r in records if "eval/loss" in r][0]
    assert result.metrics["optimizer_steps"] == 10  # 2 epochs of 5 steps, not 3
    assert (run_dir / "checkpoints" / "best.ckpt").exists()
    marker = json.loads((run_dir / "checkpoints" / "early_stopped.json").read_text())
    assert (marker["epoch"], marker["best_epoch"], marker["step"]) == (2, 1, 10)
    messages = [r.getMessage() for r in caplog.records if r.name == "trainkit"]
    assert any(m.startswith("early stopping after epoch 2: eval/loss did not improve") for m in messages)

    # the progress line and the record agree on the loss at each logged step (the mean since the record before)
    shown = {int(m.group(1)): m.group(2) for m in (re.match(r"epoch 1/3  step (\d+)/5  loss ([\d.]+)", x)
                                                  for x in messages) if m}
    recorded = {r["step"]: f"{r['train/loss']:.4f}" for r in records if "train/loss" in r}
    assert shown and all(recorded[step] == loss for step, loss in shown.items())

    with pytest.raises(ConfigError, match="was stopped early after epoch 2"):
        train(compose_config([*config, "trainer.resume=auto"]))
