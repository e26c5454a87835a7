"""One run per directory (the lock) and one record per step when a run starts anew where an earlier attempt recorded.

Runs are ``python -m trainkit`` subprocesses on the slow data of tests/app/test_run_record.py. The first run is
frozen with SIGSTOP once it is seen on disk (a record, or its "resuming from" line), so the second starts while the
first provably holds the directory; nothing waits on time. Mutations tried: the lock's acquire made a no-op in
``RunDirectoryLock`` (red: the refusal does not name the holder; the resumes both train), ``continues_at`` returning
None without a checkpoint (the killed attempt's records stay in metrics.jsonl, doubled).
"""
import hashlib
import signal
import socket
import subprocess
import sys
import time

from tests.app.test_run_record import (  # uninterrupted: the fixture
    assert_same_final_weights,
    assert_same_record,
    command,
    environment,
    overrides,
    resume,
    start,
    uninterrupted,  # noqa: F401
    wait_for_record,
)
from tests.common.callbacks import read_jsonl
from trainkit.rundir.checkpoint_file import checkpoint_files


def digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def wait_for_line(path, text, process):
    """Until `path` holds `text` (the process must still run)."""
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.01)
    raise AssertionError(f"{text!r} not in {path}: {process.poll()}")


def wait_for_checkpoint(run_dir, process):
    """Until a checkpoint of the run is on disk under its own name (the process must still run)."""
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if checkpoint_files(run_dir / "checkpoints"):
            return
        time.sleep(0.01)
    raise AssertionError(f"no checkpoint in {run_dir / 'checkpoints'}: {process.poll()}")


def wait_until_stopped(pid):
    """Until every thread of `pid` is stopped (state T in /proc), so it writes nothing more."""
    from pathlib import Path

    deadline = time.time() + 60
    while time.time() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:  # a thread that ended meanwhile
                continue
        if states and all(state in ("T", "t", "Z", "X") for state in states):
            return
    raise AssertionError(f"process {pid} did not stop within 60 s")


def refused_while_frozen(first, root, run_dir, cwd, *extra):
    """Freeze `first`, run a second command on `run_dir`: it must exit 2 naming `first`, changing nothing."""
    first.send_signal(signal.SIGSTOP)
    try:
        wait_until_stopped(first.pid)  # SIGSTOP is asynchronous: a write in flight would change the digest after it
        before = digest(run_dir)
        second = subprocess.run(command(root, run_dir, *extra), cwd=cwd, env=environment(), capture_output=True,
                                text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-3000:]
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith("trainkit: error: ") and second.stderr.count("trainkit: error") == 1
        assert f"is in use by another run (pid {first.pid} on {socket.gethostname()}, started " in last
        assert digest(run_dir) == before
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]


def test_two_new_runs_on_one_directory_one_runs_the_other_is_refused(uninterrupted, tiny_cifar10, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    first = start(tiny_cifar10, run_dir, tmp_path)
    wait_for_record(run_dir, 2, first)
    refused_while_frozen(first, tiny_cifar10, run_dir, tmp_path)
    assert_same_record(run_dir, uninterrupted)  # one record per step: the second run wrote none
    assert_same_final_weights(run_dir, uninterrupted)


def test_two_resume_auto_on_one_directory_one_continues_the_other_is_refused(uninterrupted, tiny_cifar10,  # noqa: F811
                                                                             tmp_path):
    run_dir = tmp_path / "run"
    killed = start(tiny_cifar10, run_dir, tmp_path)
    # On the checkpoint file itself: a checkpoint is written in the background, so the record of a later step can
    # come first (a CI-like run, loaded, killed after record 4 found no checkpoint of step 3 yet)
    wait_for_checkpoint(run_dir, killed)
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert checkpoint_files(run_dir / "checkpoints")

    first = start(tiny_cifar10, run_dir, tmp_path, "trainer.resume=auto")
    wait_for_line(run_dir / "train.log", "resuming from", first)
    refused_while_frozen(first, tiny_cifar10, run_dir, tmp_path, "trainer.resume=auto")
    assert "took over the lock of a run that ended without releasing it" in (run_dir / "train.log").read_text()
    assert_same_record(run_dir, uninterrupted)
    assert_same_final_weights(run_dir, uninterrupted)


def test_resume_auto_without_a_checkpoint_supersedes_the_killed_attempts_records(uninterrupted, tiny_cifar10,  # noqa: F811
                                                                                 tmp_path):
    """Killed during epoch 1, before its first checkpoint (epoch ends only here): the documented resume=auto starts a
    new run, and its record is the uninterrupted run's, TensorBoard included; the attempt's records are set aside."""
    run_dir = tmp_path / "run"
    slow = [sys.executable, "-m", "trainkit", *overrides(tiny_cifar10), "trainer.checkpoint_every_n_steps=0",
            "data._target_=tests.common.slow_data.SlowCifar10", "+data.batch_seconds=0.5", f"hydra.run.dir={run_dir}"]
    killed = subprocess.Popen(slow, cwd=tmp_path, env=environment(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    wait_for_record(run_dir, 1, killed)
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    recorded = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
    assert recorded and not checkpoint_files(run_dir / "checkpoints"), "killed after its first checkpoint"

    resume(tiny_cifar10, run_dir, tmp_path)

    log = (run_dir / "train.log").read_text()
    assert "no checkpoint in" in log and "metrics.superseded-1.jsonl" in log
    assert_same_record(run_dir, uninterrupted)
    assert_same_final_weights(run_dir, uninterrupted)
    superseded = [r["step"] for r in read_jsonl(run_dir / "metrics.superseded-1.jsonl") if "train/loss" in r]
    assert superseded == recorded
