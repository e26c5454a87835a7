"""Issue 30's last windows: a signal that lands where raising an exception in the main thread went wrong -- the
graph compile of the test-set evaluation (after the training loop), the teardown after the "finished" line -- ends
``python -m trainkit`` with one line and 128 + N, and what the run wrote stays whole. Each test holds the process
there (tests/common/start_up.py writes a marker and waits) and signals it once the marker is on disk."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.common.processes import wait_for_marker

REPO = Path(__file__).resolve().parents[2]


def _held_run(tmp_path, model):
    """A one-epoch quick start whose network is `model` (held where it says), started and waited for until it is
    held; returns the process and the gate file that would let it go on."""
    marker, gate = tmp_path / "held", tmp_path / "gate"
    process = subprocess.Popen(
        [sys.executable, "-m", "trainkit", "recipe=digits_quickstart", "trainer.epochs=1",
         f"model._target_=tests.common.start_up.{model}", f"+model.marker={marker}", f"+model.gate={gate}",
         f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), "TRAINKIT_COMPILE_CACHE": "0"})
    wait_for_marker(marker, process)
    return process, gate


def test_a_signal_inside_a_graph_compile_after_the_training_loop_is_one_line_and_143(tmp_path):
    """SIGTERM while MindSpore compiles the test-set evaluation (a constexpr of the network holds the compile).
    Mutation caught: the command not owning its process (``_owns_process`` returning False: the old ``_stop``
    handler raises inside the compile), which printed MindSpore's traceback and ``analyze_fail.ir`` notice, exit 1."""
    process, gate = _held_run(tmp_path, "CompilesUntilSignalled")
    process.send_signal(signal.SIGTERM)
    gate.write_text("go")  # lets the compile go on, for a process the signal did not end
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 143, stderr[-3000:]
    assert stderr == ("trainkit: stopped by SIGTERM outside the training loop (while starting up or finishing), so "
                      "no checkpoint was written for it: run the command again (with trainer.resume=auto to continue "
                      "a run)\n")
    assert "finished: " not in stdout
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.rstrip().endswith("stopped by SIGTERM outside the training loop (while starting up or finishing), so "
                                 "no checkpoint was written for it: run the command again (with trainer.resume=auto "
                                 "to continue a run)")


def test_a_signal_in_the_teardown_is_one_line_and_130_and_loses_nothing(tmp_path):
    """SIGINT after the "finished" line, while an ``atexit`` function holds the process in its teardown: the line
    that says the work was done, 130, and the run's record whole (metrics.jsonl's last record is the finished
    run's test set, train.log ends with the finished line). Mutation caught: main() back on finish() and the
    interpreter's own exit (the signals unrouted before the teardown): a KeyboardInterrupt traceback in the atexit
    call and exit 0."""
    process, gate = _held_run(tmp_path, "HeldAtExit")
    process.send_signal(signal.SIGINT)
    gate.write_text("go")  # the teardown goes on
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr[-3000:]
    assert stderr == ("trainkit: stopped by SIGINT outside the training loop, after the command had done its work "
                      "(what it wrote is complete)\n")
    run = tmp_path / "run"
    finished = [line for line in stdout.splitlines() if "] - finished: " in line]
    assert len(finished) == 1
    assert (run / "train.log").read_text().splitlines()[-1] == finished[0]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "test/accuracy" in records[-1] and records[-1]["epoch"] == 1


def test_a_sweep_stopped_outside_the_training_loop_says_how_to_continue_it(tmp_path):
    """A ``-m`` sweep takes the signals back as exceptions (signals.stop_by_exception), so that its launcher writes
    the summary of the jobs so far and the command that continues them: SIGTERM while job 0 prepares its data (no
    job has a record yet, so there is no summary to write, only the command). Mutation caught: the launcher's setup
    without ``stop_by_exception()`` (the process ended from the forwarding thread: only trainkit's line)."""
    marker, sweep = tmp_path / "preparing", tmp_path / "sweep"
    process = subprocess.Popen(
        [sys.executable, "-m", "trainkit", "-m", "trainer.seed=0,1", "recipe=digits_quickstart",
         "data._target_=tests.common.start_up.PreparesUntilSignalled", f"+data.marker={marker}",
         f"hydra.sweep.dir={sweep}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)})
    wait_for_marker(marker, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 143, stderr[-3000:]
    launcher, command = stderr.splitlines()
    assert launcher.startswith("trainkit: the sweep was stopped by a signal") and launcher.endswith(
        f"hydra.sweep.dir={sweep} trainer.resume=auto")
    assert command.startswith("trainkit: stopped by SIGTERM outside the training loop")
