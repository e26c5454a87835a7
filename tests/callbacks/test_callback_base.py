"""trainkit.Callback: the state its hooks see, log() into the run's record, and its hooks around a polite stop and
a resume; MindSpore's own callbacks beside it. Expected values are written here independently: the cosine
schedule in NumPy, the counters by integer arithmetic."""
import math
import os
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tests.callbacks.user_callbacks import CountSteps, Recorder
from tests.common.callbacks import read_jsonl
from tests.common.tensorboard_events import read_scalars, read_scalars_as_tensorboard_shows
from trainkit import Callback
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.callbacks.base import CallbackRun, LogValueError
from trainkit.errors import RunInterrupted

EPOCHS, ACCUMULATION, LR = 2, 2, 0.01
CALLBACKS = ("callbacks=[{_target_:tests.callbacks.user_callbacks.Recorder},"
             "{_target_:tests.callbacks.user_callbacks.CountSteps}]")


def overrides(run_dir, *more):
    return [f"trainer.epochs={EPOCHS}", f"wrapper.accumulation_steps={ACCUMULATION}", "lr_schedule=cosine",
            "lr_schedule.warmup_epochs=0", f"optimizer.lr={LR}", "logger.progress=off", "logger.log_every_n_steps=5",
            "trainer.checkpoint_every_n_steps=0", f"run_dir={run_dir}", CALLBACKS, *more]


def cosine_rates(steps_per_epoch: int) -> np.ndarray:
    """One rate per optimizer update: ceil(epochs * updates per epoch) updates, lr (1 + cos(pi u / (n - 1))) / 2."""
    updates = math.ceil(EPOCHS * steps_per_epoch / ACCUMULATION)
    return LR * 0.5 * (1 + np.cos(np.pi * np.arange(updates) / (updates - 1)))


def of_type(result, kind):
    (found,) = [c for c in result.callbacks if type(c) is kind]
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    return run_dir, train(compose_config(overrides(run_dir)))


def test_the_state_counts_micro_batches_optimizer_steps_and_epochs(uninterrupted):
    run_dir, result = uninterrupted
    recorder = of_type(result, Recorder)
    steps_per_epoch = result.data.train_dataset().get_dataset_size()
    total = EPOCHS * steps_per_epoch
    rates = cosine_rates(steps_per_epoch)
    assert recorder.started == [(0, 1, pytest.approx(rates[0]))]
    assert [s[:4] for s in recorder.steps] == [(s, s // ACCUMULATION, (s - 1) // steps_per_epoch + 1,
                                                (s - 1) % steps_per_epoch + 1) for s in range(1, total + 1)]
    # the rate of the window each micro-batch belongs to, the last one included (MindSpore's get_lr() goes past it)
    np.testing.assert_allclose([s[4] for s in recorder.steps], rates[(np.arange(1, total + 1) - 1) // ACCUMULATION],
                               rtol=1e-6)
    assert [(e, s) for e, s, _ in recorder.epochs] == [(e, e * steps_per_epoch) for e in range(1, EPOCHS + 1)]
    assert recorder.ended == [total]
    network, wrapper, optimizer, directory, rank, writer = recorder.objects
    assert network is result.network and wrapper is result.wrapper and optimizer is result.optimizer
    assert directory == run_dir and rank == 0 and writer is True


def test_log_lands_in_metrics_jsonl_with_both_counters_in_every_record(uninterrupted):
    run_dir, result = uninterrupted
    steps_per_epoch = result.data.train_dataset().get_dataset_size()
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert all(r["optimizer_step"] == r["step"] // ACCUMULATION for r in records)  # every record, trainkit's too
    logged = [(r["step"], r["custom/learning_rate"]) for r in records if "custom/learning_rate" in r]
    assert [s for s, _ in logged] == list(range(1, EPOCHS * steps_per_epoch + 1))
    rates = cosine_rates(steps_per_epoch)
    np.testing.assert_allclose([v for _, v in logged], rates[(np.arange(len(logged))) // ACCUMULATION], rtol=1e-6)
    evaluations = {r["step"]: r["eval/accuracy"] for r in records if "eval/accuracy" in r}
    epoch_logs = {r["step"]: r["custom/epoch_accuracy"] for r in records if "custom/epoch_accuracy" in r}
    assert epoch_logs == evaluations  # on_epoch_end runs after the epoch's evaluation and sees its results
    assert [r["custom/ended"] for r in records if "custom/ended" in r] == [EPOCHS * steps_per_epoch]
    (last,) = [r for r in records if "custom/not_a_number" in r]  # non-finite values are recorded as they are
    assert math.isnan(last["custom/not_a_number"]) and last["custom/infinite"] == -math.inf
    assert last["step"] == EPOCHS * steps_per_epoch


def test_log_lands_in_tensorboard_at_the_same_steps(uninterrupted):
    run_dir, result = uninterrupted
    steps_per_epoch = result.data.train_dataset().get_dataset_size()
    scalars = read_scalars(run_dir / "tensorboard")
    logged = scalars["custom/learning_rate"]
    assert [s for s, _ in logged] == list(range(1, EPOCHS * steps_per_epoch + 1))
    np.testing.assert_allclose([v for _, v in logged], cosine_rates(steps_per_epoch)[np.arange(len(logged)) //
                                                                                       ACCUMULATION], rtol=1e-6)
    assert [s for s, _ in scalars["custom/epoch_accuracy"]] == [e * steps_per_epoch for e in range(1, EPOCHS + 1)]


def test_mindspore_callbacks_keep_working_beside_trainkits(uninterrupted):
    _, result = uninterrupted
    counter = of_type(result, CountSteps)
    assert counter.steps == EPOCHS * result.data.train_dataset().get_dataset_size() and counter.epoch_ends == EPOCHS


def test_a_polite_stop_reports_no_partial_epoch_and_the_resume_records_each_step_once(uninterrupted, tmp_path):
    reference_dir, reference = uninterrupted
    steps_per_epoch = reference.data.train_dataset().get_dataset_size()
    # in epoch 2; SIGTERM sent in the user's on_step_end: trainkit's stop runs after the user's callbacks
    # (trainkit.callbacks.order), so the run stops after that same step, with a checkpoint there
    stop_after = steps_per_epoch + 10
    recorder = CALLBACKS.replace("Recorder}", f"Recorder,stop_at_step:{stop_after}}}")
    with pytest.raises(RunInterrupted):
        train(compose_config([*overrides(tmp_path), recorder]))
    assert (tmp_path / "epochs.csv").read_text() == f"1,{steps_per_epoch}\n"  # no end for the interrupted epoch 2

    result = train(compose_config([*overrides(tmp_path), "trainer.resume=auto"]))
    continued = of_type(result, Recorder)
    assert continued.started[0][0] == stop_after  # the run starts again after the step it stopped at
    # a MindSpore callback's cur_step_num continues too: the steps after the stop, each once
    assert of_type(result, CountSteps).step_numbers == list(range(stop_after + 1, EPOCHS * steps_per_epoch + 1))
    assert (tmp_path / "epochs.csv").read_text() == "".join(
        f"{e},{e * steps_per_epoch}\n" for e in range(1, EPOCHS + 1))  # each epoch once

    def logged(directory):
        return [(r["step"], r["optimizer_step"], r["custom/learning_rate"])
                for r in read_jsonl(directory / "metrics.jsonl") if "custom/learning_rate" in r]

    assert logged(tmp_path) == logged(reference_dir)  # each step once, as the run that never stopped


class _Logs(Callback):
    def __init__(self, name, value):
        super().__init__()
        self.name, self.value = name, value

    def on_epoch_end(self, state):
        self.log(self.name, self.value)


@pytest.mark.parametrize("name, value, error, message", [
    ("train/loss", 1.0, ValueError, "_Logs.log('train/loss', ...): the name must be"),
    ("step", 1.0, ValueError, "other than step, optimizer_step, epoch, time"),
    ("", 1.0, ValueError, "non-empty string"),
    ("mine", "high", TypeError, "the value must be one real number; got str 'high'"),
    ("mine", [1.0, 2.0], TypeError, "got list"),
    ("mine", True, TypeError, "got bool"),
    ("mine", 1 + 2j, TypeError, "got complex"),
    ("mine", Decimal("sNaN"), TypeError, "got Decimal Decimal('sNaN')"),
])
def test_log_refuses_trainkits_names_and_values_that_are_not_one_number(name, value, error, message):
    callback = _Logs(name, value)
    callback.bind(CallbackRun(run_log=None, network=None, wrapper=None, optimizer=None, learning_rates=[0.1],
                              run_dir=None, rank=0, writer=True, steps_per_epoch=1, accumulation_steps=1))
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        callback._call(callback.on_epoch_end, callback._state(1))


@pytest.mark.parametrize("value, shown", [
    (10 ** 400, "got int 1000000000"),
    (-10 ** 400, "got int -1000000000"),
    (10 ** 5000, "got int <int of 16610 bits>"),  # Python refuses the repr of an int of over 4300 digits
    (Decimal("1e400"), "got Decimal Decimal('1E+400')"),  # float() would make it inf without a word
    (Fraction(10 ** 400, 3), "got Fraction Fraction(1000000000"),
    ([10 ** 400], "got list [1000000000"),
    (np.longdouble("1e400"), "got longdouble 1e+400"),  # finite in 80 bits, inf in 64
], ids=["1e400", "-1e400", "1e5000", "Decimal", "Fraction", "list", "longdouble"])
def test_log_refuses_a_finite_number_beyond_float64_with_one_line(value, shown):
    """Mutation caught: without the OverflowError/isinf check, 10**400 raised AttributeError (a 38-line
    traceback in a run) and Decimal('1e400') was recorded as Infinity."""
    callback = _Logs("mine", value)
    callback.bind(CallbackRun(run_log=None, network=None, wrapper=None, optimizer=None, learning_rates=[0.1],
                              run_dir=None, rank=0, writer=True, steps_per_epoch=1, accumulation_steps=1))
    with pytest.raises(LogValueError) as raised:
        callback._call(callback.on_epoch_end, callback._state(1))
    message = str(raised.value)
    assert message.startswith("_Logs.log('mine', ...): the value must be one real number within float64's range")
    assert shown in message and "\n" not in message and len(message) < 200


class _Scalars:
    def __init__(self):
        self.recorded = []

    def scalars(self, step, values, epoch):
        self.recorded.append((step, dict(values)))


@pytest.mark.parametrize("value, expected", [
    (Decimal("1.5"), 1.5), (Fraction(1, 3), 1 / 3), (2 ** 70, 1180591620717411303424.0),
    (Decimal("-Infinity"), -math.inf), (np.float16(0.25), 0.25),
])
def test_log_records_python_s_other_real_numbers_as_their_float(value, expected):
    """Mutation caught: an object array's element has no .item(): Decimal and Fraction raised AttributeError."""
    record = _Scalars()
    callback = _Logs("mine", value)
    callback.bind(CallbackRun(run_log=record, network=None, wrapper=None, optimizer=None, learning_rates=[0.1],
                              run_dir=None, rank=0, writer=True, steps_per_epoch=1, accumulation_steps=1))
    callback._call(callback.on_epoch_end, callback._state(1))
    assert record.recorded == [(1, {"mine": expected})]


def test_log_outside_a_hook_says_where_to_call_it():
    with pytest.raises(RuntimeError, match="outside a hook"):
        _Logs("x", 1.0).log("x", 1.0)


def test_a_bad_log_in_a_run_stops_it_with_one_line_naming_the_callback_and_the_name(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    callback = "callbacks=[{_target_:tests.callbacks.user_callbacks.LogsText}]"
    done = subprocess.run([sys.executable, "-m", "trainkit", "trainer.epochs=1", "logger.progress=off",
                           f"run_dir={tmp_path / 'run'}", callback],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "trainkit: error: LogsText.log('custom/mood', ...): the value must be one real number; got str 'high'")
    assert "Traceback" not in done.stderr


def test_logged_values_after_the_checkpoint_a_run_continues_from_are_superseded_with_the_rest(uninterrupted, tmp_path):
    reference_dir, reference = uninterrupted
    steps_per_epoch = reference.data.train_dataset().get_dataset_size()
    stop_after = steps_per_epoch + 10
    recorder = CALLBACKS.replace("Recorder}", f"Recorder,stop_at_step:{stop_after}}}")
    with pytest.raises(RunInterrupted):
        train(compose_config([*overrides(tmp_path), recorder]))
    # continue from epoch 1's checkpoint: the 11 steps logged after it are recorded again, once in the record
    older = tmp_path / "checkpoints" / f"trainkit-1_{steps_per_epoch}.ckpt"
    train(compose_config([*overrides(tmp_path), f"trainer.resume={older}"]))

    def logged(path):
        return [(r["step"], r["custom/learning_rate"]) for r in read_jsonl(path) if "custom/learning_rate" in r]

    assert logged(tmp_path / "metrics.jsonl") == logged(reference_dir / "metrics.jsonl")
    assert [s for s, _ in logged(tmp_path / "metrics.superseded-1.jsonl")] == list(
        range(steps_per_epoch + 1, stop_after + 1))
    assert (tmp_path / "epochs.csv").read_text() == "".join(
        f"{e},{e * steps_per_epoch}\n" for e in range(1, EPOCHS + 1))
    tensorboard = read_scalars_as_tensorboard_shows(tmp_path / "tensorboard")["custom/learning_rate"]
    assert [s for s, _ in tensorboard] == list(range(1, EPOCHS * steps_per_epoch + 1))


def test_early_stopping_ends_the_epoch_it_stops_after_once_and_no_epoch_after_it(tmp_path):
    """min_delta larger than any change: patience 1 stops after epoch 2 of 4, at that epoch's end: a complete
    epoch, so on_epoch_end runs for it (and for no later one), then on_run_end once."""
    config = [o.replace(f"trainer.epochs={EPOCHS}", "trainer.epochs=4") for o in overrides(tmp_path)]
    result = train(compose_config([*config, "trainer.early_stopping.metric=loss", "trainer.early_stopping.patience=1",
                                   "trainer.early_stopping.min_delta=1000"]))
    steps_per_epoch = result.data.train_dataset().get_dataset_size()
    recorder = of_type(result, Recorder)
    assert result.metrics["stopped_epoch"] == 2
    assert [(e, s) for e, s, _ in recorder.epochs] == [(1, steps_per_epoch), (2, 2 * steps_per_epoch)]
    assert (tmp_path / "epochs.csv").read_text() == f"1,{steps_per_epoch}\n2,{2 * steps_per_epoch}\n"
    assert recorder.ended == [2 * steps_per_epoch]
