"""A run's record through interruptions: SIGKILL, SIGTERM and SIGINT, each followed by ``trainer.resume=auto``.

One uninterrupted run (A, in-process) is the reference. The interrupted runs are ``python -m trainkit`` subprocesses
on the same config (their data module only paces the batches, so a signal lands mid-training). After each
continuation the run must end with A's weights bitwise, and its record must be A's: one ``metrics.jsonl`` record per
step and kind, equal key by key (wall-clock fields aside), and TensorBoard showing one value per step and tag --
the killed run's extra records moved to ``metrics.superseded-<n>.jsonl``.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import psutil
import pytest

from tests.common.callbacks import read_jsonl
from tests.common.tensorboard_events import read_scalars_as_tensorboard_shows
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.rundir.checkpoint_file import checkpoint_files, newest_valid_checkpoint

REPO = Path(__file__).resolve().parents[2]
STEPS_PER_EPOCH, EPOCHS = 5, 4
TOTAL = STEPS_PER_EPOCH * EPOCHS
WALL_CLOCK = ("time", "train/samples_per_second")
SLOW_DATA = ["data._target_=tests.common.slow_data.SlowCifar10", "+data.batch_seconds=0.06"]


def overrides(root, checkpoint_every=3):
    return ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", f"data.root={root}", "data.val_fraction=0.2",
            "data.image_size=8",
            "data.batch_size=8", "data.num_parallel_workers=1", f"trainer.epochs={EPOCHS}",
            f"trainer.checkpoint_every_n_steps={checkpoint_every}", f"trainer.keep_checkpoints={TOTAL}",
            "logger.progress=log",
            "logger.log_every_n_steps=1", "wrapper.accumulation_steps=2", "wrapper.ema_decay=0.9",
            "wrapper.loss_scale=dynamic", "wrapper.loss_scale_value=1024", "wrapper.scale_window=3"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_cifar10, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")  # a checkpoint after every step, to compare stops with
    train(compose_config([*overrides(tiny_cifar10, checkpoint_every=1), f"run_dir={run_dir}"]))
    return run_dir


def command(root, run_dir, *extra):
    return [sys.executable, "-m", "trainkit", *overrides(root), *SLOW_DATA, f"hydra.run.dir={run_dir}", *extra]


def environment():
    return {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}


def start(root, run_dir, cwd, *extra):
    return subprocess.Popen(command(root, run_dir, *extra), cwd=cwd, env=environment(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait_for_record(run_dir, step, process):
    """Until metrics.jsonl holds a training record at `step` or later."""
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        try:
            steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
        except (OSError, ValueError):
            steps = []
        if steps and steps[-1] >= step:
            return steps[-1]
        time.sleep(0.01)
    raise AssertionError(f"no record at step {step}: {process.poll()}")


def kill_between_checkpoints(process, run_dir, after_step):
    """SIGKILL `process` once metrics.jsonl holds a record at `after_step` or later and past the newest checkpoint.

    The process is frozen (SIGSTOP, then its state read from the kernel) while the files are read, so what they say
    is what the kill leaves: no race with the next step or checkpoint, however loaded the machine. Returns the last
    recorded step and the newest checkpoint's."""
    while True:
        wait_for_record(run_dir, after_step, process)
        process.send_signal(signal.SIGSTOP)
        frozen = psutil.Process(process.pid)
        while frozen.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            time.sleep(0.01)
        try:
            recorded = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
        except ValueError:  # frozen in the middle of writing a line
            recorded = []
        newest = newest_valid_checkpoint(run_dir / "checkpoints")
        continued_from = newest.position.micro_steps if newest else 0
        if recorded and recorded[-1] > continued_from:
            process.send_signal(signal.SIGKILL)
            process.communicate()
            assert process.returncode == -signal.SIGKILL
            return recorded[-1], continued_from
        after_step = max([after_step, *recorded]) + 1  # a checkpoint at the last record: the next step, then
        process.send_signal(signal.SIGCONT)


def resume(root, run_dir, cwd):
    result = subprocess.run(command(root, run_dir, "trainer.resume=auto"), cwd=cwd, env=environment(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def checkpoint_arrays(run_dir, name=f"trainkit-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt"):
    path = run_dir / "checkpoints" / name
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items() if not isinstance(v, str)}


def assert_same_final_weights(run_dir, reference, name=f"trainkit-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt"):
    actual, expected = checkpoint_arrays(run_dir, name), checkpoint_arrays(reference, name)
    assert sorted(actual) == sorted(expected)
    differing = [name for name in expected if not np.array_equal(actual[name], expected[name])]
    assert not differing, differing[:5]


def without_wall_clock(records):
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in records]


def assert_same_record(run_dir, reference):
    """metrics.jsonl equal to the reference's, record by record (each kind once per step), and TensorBoard's view
    of the events one value per step and tag, the values of the reference."""
    records, expected = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(reference / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == list(range(1, TOTAL + 1))
    assert [r["step"] for r in records if "eval/loss" in r] == [STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)]
    assert without_wall_clock(records) == without_wall_clock(expected)
    shown = read_scalars_as_tensorboard_shows(run_dir / "tensorboard")
    reference_shown = read_scalars_as_tensorboard_shows(reference / "tensorboard")
    assert sorted(shown) == sorted(reference_shown)
    for tag, values in shown.items():
        steps = [step for step, _ in values]
        assert steps == sorted(set(steps)), f"{tag}: {steps}"
        if tag not in WALL_CLOCK:
            assert values == reference_shown[tag], tag


def no_process_left(run_dir):
    return not [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]


def stop_with(process, sent, run_dir):
    """Send `sent` to a run; check it stopped after a step with a checkpoint there; returns that step."""
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=120)
    # MindSpore's runtime answers a SIGINT that lands while it runs with kill(self, SIGTERM) (seen with strace);
    # trainkit.process.signals keeps both from its handler, so Ctrl-C is SIGINT and 130. Mutation caught (its start()
    # a no-op): "SIGTERM received", status 143, for the SIGINT sent after step 4.
    assert process.returncode == 128 + sent, stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    stopped = [line for line in log.splitlines() if "stopped by SIG" in line]
    assert len(stopped) == 1, log[-3000:]
    name = signal.Signals(sent).name
    assert f"{name} received" in log and f"stopped by {name}" in stopped[0], log[-3000:]
    step = int(stopped[0].split(" after step ")[1].split(" ")[0])
    assert step < TOTAL
    epoch, in_epoch = divmod(step - 1, STEPS_PER_EPOCH)
    at_stop = run_dir / "checkpoints" / f"trainkit-{epoch + 1}_{in_epoch + 1}.ckpt"
    assert checkpoint_files(run_dir / "checkpoints")[-1] == at_stop
    assert f"after step {step} (epoch {epoch + 1}, step {in_epoch + 1} of {STEPS_PER_EPOCH} in it): checkpoint " \
           f"{at_stop};" in stopped[0]
    assert int(ms.load_checkpoint(str(at_stop))["micro_steps"].asnumpy()) == step
    continue_with = stopped[0].split("continue with: ")[1]
    assert continue_with.startswith("python -m trainkit ") and continue_with.endswith(
        f"hydra.run.dir={run_dir} trainer.resume=auto")
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if "train/loss" in r][-1] == step  # flushed up to the stop
    assert no_process_left(run_dir)
    return step


def test_sigint_then_sigkill_between_checkpoints_then_resume_keep_one_record_per_step(uninterrupted, tiny_cifar10,
                                                                                      tmp_path):
    """Ctrl-C stops the run politely; the continuation is killed (SIGKILL) between two checkpoints; the second
    continuation ends as the run that never stopped, record included."""
    run_dir = tmp_path / "run"
    process = start(tiny_cifar10, run_dir, tmp_path)
    wait_for_record(run_dir, 4, process)
    stopped_at = stop_with(process, signal.SIGINT, run_dir)

    process = start(tiny_cifar10, run_dir, tmp_path, "trainer.resume=auto")
    killed_at, continued_from = kill_between_checkpoints(process, run_dir, stopped_at + 1)
    recorded = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
    assert recorded[-1] == killed_at > continued_from  # records the continuation writes again

    resume(tiny_cifar10, run_dir, tmp_path)

    assert_same_final_weights(run_dir, uninterrupted)
    assert_same_record(run_dir, uninterrupted)
    superseded = read_jsonl(run_dir / "metrics.superseded-1.jsonl")
    assert [r["step"] for r in superseded if "train/loss" in r] == list(range(continued_from + 1, recorded[-1] + 1))
    assert not (run_dir / "metrics.superseded-2.jsonl").exists()  # the polite stop left nothing past its checkpoint


def test_sigterm_stops_after_the_step_with_the_uninterrupted_runs_checkpoint_there(uninterrupted, tiny_cifar10,
                                                                                  tmp_path):
    """The checkpoint written at a SIGTERM stop is bitwise the uninterrupted run's at that step, so resume=auto
    continues exactly (as the test above shows for a SIGINT stop, and tests/test_resume.py for any checkpoint)."""
    run_dir = tmp_path / "run"
    process = start(tiny_cifar10, run_dir, tmp_path)
    wait_for_record(run_dir, 8, process)
    stopped_at = stop_with(process, signal.SIGTERM, run_dir)
    epoch, in_epoch = divmod(stopped_at - 1, STEPS_PER_EPOCH)
    assert_same_final_weights(run_dir, uninterrupted, f"trainkit-{epoch + 1}_{in_epoch + 1}.ckpt")
    records = read_jsonl(run_dir / "metrics.jsonl")
    expected = [r for r in read_jsonl(uninterrupted / "metrics.jsonl") if r["step"] <= stopped_at]
    assert without_wall_clock(records) == without_wall_clock(expected)
