"""Hostile input to `python -m trainkit` is one line and exit status 2, never a traceback, a hang or a change to an
earlier run: a run directory that is a file or cannot be written, huge values."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.common.processes import wait_for_marker
from tests.common.transcripts import run_in_process


def trainkit(*args):
    return run_in_process(["python", "-m", "trainkit", *args])


def one_line(printed, message):
    assert printed.status == 2, printed.stderr
    assert printed.stderr.count("\n") == 1 and printed.stderr.startswith("trainkit: error: "), printed.stderr
    assert message in printed.stderr, printed.stderr


def test_a_run_directory_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("not a folder")
    one_line(trainkit(f"hydra.run.dir={tmp_path / 'taken'}"), f"{tmp_path / 'taken'} is a file, not a folder")
    one_line(trainkit(f"hydra.run.dir={tmp_path / 'taken' / 'run'}"), f"{tmp_path / 'taken'} is a file, not a folder")
    assert (tmp_path / "taken").read_text() == "not a folder"


@pytest.mark.parametrize("planted", ["train.log", ".hydra/config.yaml", "class_names.json.tmp", "metrics.jsonl",
                                     "checkpoints/best.json.tmp"])
def test_a_file_link_planted_in_the_run_directory_is_refused_and_nothing_is_written_through_it(planted, tmp_path,
                                                                                                  monkeypatch):
    """Appending to train.log, writing .hydra/config.yaml or a .tmp file renamed into place would write through a
    link to wherever it points (train.log took a run's log lines, .hydra/config.yaml created the file it named,
    both with exit 0). Now: one line naming the link, and its target as it was: a file someone else holds, and a
    dangling link's target not created."""
    monkeypatch.chdir(tmp_path)
    run_dir, victim, missing = tmp_path / "run", tmp_path / "victim.txt", tmp_path / "not-there.txt"
    victim.write_text("precious\n")
    for target, sub in ((victim, "held"), (missing, "dangling")):
        link = run_dir / sub / planted
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        one_line(trainkit(f"hydra.run.dir={run_dir / sub}", "trainer.epochs=1"),
                 f"{link} is a symbolic link (to {target})")
    assert victim.read_text() == "precious\n" and not missing.exists()


def test_a_link_to_a_folder_inside_the_run_directory_is_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes").symlink_to(tmp_path / "elsewhere")
    printed = trainkit(f"hydra.run.dir={tmp_path / 'run'}", "trainer.epochs=1", "logger.progress=off")
    assert printed.status == 0, printed.stderr
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_a_read_only_run_directory_is_one_line(tmp_path, monkeypatch):
    # The tests may run as root, for whom every folder is writable: os.access says what a user would be told.
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(locked) and real_access(path, mode))
    one_line(trainkit(f"hydra.run.dir={locked}"), f"{locked} is not writable")
    one_line(trainkit(f"hydra.run.dir={locked}/new/run"), f"{locked} is not writable")
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["trainer.epochs=100000000000"], "trainer.epochs=100000000000 is not valid: it must be an integer in "
                                      "[1, 100,000,000]"),
    (["trainer.epochs=10000000"], "trainer.epochs=10000000 is not valid with 39 steps per epoch: 390,000,000 "
                                  "micro-batches in all"),
    (["data.image_size=100000"], "data.image_size=100000 is not valid: it must be at most 4096"),
])
def test_huge_values_are_refused(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line(trainkit("recipe=digits_quickstart", *args, f"hydra.run.dir={tmp_path / 'run'}"), message)


def test_a_full_disk_during_a_checkpoint_save_leaves_no_temporary_file_and_says_so(tmp_path, monkeypatch):
    import errno

    import mindspore as ms
    from mindspore import nn

    from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint
    from trainkit.errors import TrainingError
    from trainkit.rundir.checkpoint_file import checkpoint_files

    class Context:
        def __init__(self, step):
            self.step = step

        def original_args(self):
            return type("Params", (), {"cur_step_num": self.step})()

    callback = PeriodicCheckpoint(nn.Dense(2, 2), tmp_path, steps_per_epoch=4, every_n_steps=1, keep=2)
    callback.on_train_begin(Context(0))
    callback.on_train_step_end(Context(1))
    callback.wait()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def disk_full(network, name, **kwargs):  # MindSpore had written part of its temporary file
        (tmp_path / "trainkit-1_2.tmp").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)

    monkeypatch.setattr(ms, "save_checkpoint", disk_full)
    callback.on_train_step_end(Context(2))  # written on the callback's thread: the error comes at the next wait
    with pytest.raises(TrainingError, match=r"trainkit-1_2.ckpt could not be written: the disk is full \(No space"):
        callback.wait()  # what the next save and the train's end do first
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no .tmp, the earlier one intact
    assert [p.name for p in checkpoint_files(tmp_path)] == ["trainkit-1_1.ckpt"]


def test_sigterm_during_start_up_is_one_line_and_status_143(tmp_path):
    """While the data prepares, in a run directory an earlier run's train.log is in: the one line, 143, and that log
    as it was (trainkit.process.signals' thread ends the process after held_log's refusal, which writes nothing into an
    earlier log). Mutation caught: the farewell releasing the held lines and logging its message instead of
    ``held_log.drop`` (the earlier log got the refusal's line)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    marker = tmp_path / "preparing"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text("an earlier run's line\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "trainkit", "recipe=digits_quickstart",
         "data._target_=tests.common.start_up.PreparesUntilSignalled", f"+data.marker={marker}",
         f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(repo)})
    wait_for_marker(marker, process, seconds=240)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("trainkit: stopped by SIGTERM outside the training loop")
    assert (tmp_path / "run" / "train.log").read_text() == "an earlier run's line\n"


def test_a_clone_folder_named_trainkit_in_the_current_directory_is_named(tmp_path):
    import importlib.metadata
    import subprocess
    import sys

    try:
        importlib.metadata.distribution("trainkit")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("trainkit is not installed: only an installed package can be hidden by a folder")
    (tmp_path / "trainkit").mkdir()
    (tmp_path / "trainkit" / "README.md").write_text("a clone of the repository")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "trainkit", "recipe=digits_quickstart"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"trainkit: error: the folder {tmp_path / 'trainkit'} hides the installed trainkit "
                             "package (python -m puts the current directory first on the import path): run the "
                             "command from another directory, e.g. inside that folder\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainkit"]


def _process_state(pid):
    """The state letter of /proc/PID/stat (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _stop_and_continue(process):
    """Ctrl-Z then ``fg``: stopped for longer than the signal thread's poll period, then continued. Before issue 30's
    fix this interrupted the forwarding thread's timed wait, which then read a garbage signal number and died."""
    from trainkit.process import signals

    process.send_signal(signal.SIGSTOP)
    while _process_state(process.pid) != "T":  # wait on /proc
        time.sleep(0.01)
    time.sleep(4 * signals._POLL_SECONDS)  # the input, not a synchronisation: how long the process stays stopped
    process.send_signal(signal.SIGCONT)


# The moments: while ``python -m`` looks for ``trainkit.__main__`` (only the package's ``__init__`` has run: the signals
# are routed there since issue 30's last round); inside ``import hydra`` (the command's first import, before any handler
# of trainkit's could exist); inside ``import mindspore`` (its C extension, held); and 0.1 s and 0.5 s after that import
# goes on (somewhere in the rest of ``import mindspore``, the config's composition or the build: wherever the delay
# lands, the answer is the same). Each after a stop and continue of the process. In the default suite: the held imports
# (the mindspore ones take 5-10 s under load, so one signal there). Slow-marked: the rest, and the moments after the
# import (a signal there ends the process from the signal thread, as tests/app/test_signal_windows.py shows
# inside a compile; before issue 30's last round a raise at an arbitrary bytecode of a library went wrong 1 run in 40).
@pytest.mark.parametrize("held,after,sent", [
    pytest.param("trainkit.__main__", None, signal.SIGTERM, id="before-main-sigterm"),
    pytest.param("hydra", None, signal.SIGTERM, id="in-hydra-sigterm"),
    pytest.param("hydra", None, signal.SIGINT, id="in-hydra-sigint"),
    pytest.param("mindspore._c_expression", None, signal.SIGINT, id="in-mindspore-sigint"),
    pytest.param("mindspore._c_expression", None, signal.SIGTERM, id="in-mindspore-sigterm", marks=pytest.mark.slow),
    pytest.param("mindspore._c_expression", 0.1, signal.SIGTERM, id="0.1s-after-sigterm", marks=pytest.mark.slow),
    pytest.param("mindspore._c_expression", 0.5, signal.SIGINT, id="0.5s-after-sigint", marks=pytest.mark.slow),
])
def test_a_signal_inside_an_import_is_one_line_and_128_plus_its_number(held, after, sent, tmp_path):
    """The signal lands while an import holds (tests/common/import_gate stops it there until the gate opens), or a
    moment after it goes on; the process was stopped and continued just before. Then the one line and 128 + signal.
    Mutations caught: signals.start() a no-op (during ``import hydra`` SIGTERM killed the process without a
    word, status -15, and SIGINT was a KeyboardInterrupt traceback); the package's ``__init__`` not routing them
    (before-main: -15, the signal's default action, as ``__main__`` routed them only after its own imports); the
    forwarding thread back on ``sigtimedwait(SIGNALS, 0.05)`` (issue 30: the stop and continue killed it, the signal was
    lost, exit 0). (A handler raising inside MindSpore's C initialisation gave ``ImportError: initialization failed`` in
    a Hydra traceback or a "Fatal Python error": not reproducible on demand, since that code runs no Python a test can
    hold; the same deferral covers it.)"""
    repo = Path(__file__).resolve().parents[2]
    marker, gate = tmp_path / "importing", tmp_path / "gate"
    env = {**os.environ, "GLOG_v": "3", "TRAINKIT_TEST_IMPORT_HOLD": held, "TRAINKIT_TEST_IMPORT_MARKER": str(marker),
           "TRAINKIT_TEST_IMPORT_GATE": str(gate),
           "PYTHONPATH": os.pathsep.join([str(repo / "tests" / "common" / "import_gate"), str(repo)])}
    process = subprocess.Popen([sys.executable, "-m", "trainkit", "recipe=digits_quickstart",
                                f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    wait_for_marker(marker, process, seconds=240)
    if after is not None:
        gate.write_text("go")  # the import goes on; the signal comes `after` seconds later, wherever that is
        time.sleep(after)  # the input: a moment further on in the start-up, not a synchronisation
    _stop_and_continue(process)
    process.send_signal(sent)
    gate.write_text("go")  # lets the import go on
    _, stderr = process.communicate(timeout=240)
    name = signal.Signals(sent).name
    assert process.returncode == 128 + sent, stderr[-3000:]
    assert stderr.count("\n") == 1 and stderr.startswith(f"trainkit: stopped by {name} outside the training loop")


def test_a_full_disk_while_best_ckpt_is_written_is_one_error_and_leaves_the_previous_best(tmp_path, monkeypatch):
    """A full disk in the middle of best.ckpt's save (seen on this machine: a bench's ResNet-50 run ended "the run
    crashed (OSError)" with a traceback, and MindSpore's partial ``best.tmp.tmp`` stayed): one TrainingError naming
    best.ckpt, MindSpore's temporary file removed, best.ckpt and best.json as they were, the best so far unchanged.
    Mutation caught: the save outside ``nothing_partial_left`` (the OSError and the partial file)."""
    import errno

    import mindspore as ms
    from mindspore import nn

    from trainkit.callbacks.best_checkpoint import BestCheckpoint
    from trainkit.errors import TrainingError

    class FakeEvaluation:  # what BestCheckpoint reads of an Evaluation callback
        metric_names = ["eval/accuracy"]
        history = []

    best = BestCheckpoint(FakeEvaluation(), tmp_path, metric="eval/accuracy", mode="max")
    network = nn.Dense(2, 2)
    assert best.update({"eval/accuracy": 0.5, "epoch": 1, "step": 4}, network)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def disk_full(network, name, **kwargs):  # MindSpore had written part of its temporary file, best.tmp.tmp
        Path(name).with_suffix(".tmp").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)

    monkeypatch.setattr(ms, "save_checkpoint", disk_full)
    with pytest.raises(TrainingError, match=r"checkpoint .*best\.ckpt could not be written: the disk is full \(No "
                                            r"space left on device\); nothing partial was left and best\.ckpt holds "
                                            r"the previous best, intact"):
        best.update({"eval/accuracy": 0.9, "epoch": 2, "step": 8}, network)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert best.best == 0.5
    first = BestCheckpoint(FakeEvaluation(), tmp_path / "first", metric="eval/accuracy", mode="max")
    with pytest.raises(TrainingError, match=r"nothing partial was left and no best\.ckpt was left: free some space"):
        first.update({"eval/accuracy": 0.9, "epoch": 1, "step": 4}, network)  # a first best: nothing to keep
    assert not list((tmp_path / "first").iterdir()) and first.best is None
