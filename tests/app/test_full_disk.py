"""A full disk (or quota) is one line naming the file, exit status 1, not a crash's traceback: the records, the
saved config, train.log (a checkpoint's save says it itself: tests/app/test_hostile_input.py). /dev/full stands
for the full disk: every write that reaches it fails with ENOSPC, as a full disk's does."""
import errno
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainkit.callbacks.run_log import RunLog
from trainkit.errors import disk_full, naming_the_file
from trainkit.rundir import held_log

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")


def test_disk_full_is_enospc_or_a_quota_and_nothing_else():
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not disk_full(PermissionError(errno.EACCES, "Permission denied", "x"))
    assert not disk_full(ValueError("no"))


def test_a_write_error_without_a_file_names_the_file_and_one_with_a_file_keeps_it(tmp_path):
    with pytest.raises(OSError) as raised, naming_the_file(tmp_path / "a.yaml"), open("/dev/full", "w") as stream:
        stream.write("x")  # fails at the flush of close(): an OSError that names no file
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "a.yaml")
    with pytest.raises(OSError) as raised, naming_the_file(tmp_path / "a.yaml"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "other")
    assert raised.value.filename == "other"


def test_run_log_names_the_metrics_file_and_the_event_file_it_could_not_write(tmp_path):
    records = RunLog(tmp_path / "metrics", tensorboard=False)
    records._metrics.close()
    records._metrics = open("/dev/full", "a", encoding="utf-8")  # noqa: SIM115
    with pytest.raises(OSError) as raised:
        records.scalars(10, {"train/loss": 0.5})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(records.metrics_path)
    with pytest.raises(OSError) as raised:  # the line is still in its buffer: closing flushes it again
        records.close()
    assert raised.value.filename == str(records.metrics_path)

    events = RunLog(tmp_path / "events", metrics_file=None)
    stream = events._writer._writer._py_recordio_writer
    stream._writer.close()
    stream._writer = open("/dev/full", "wb")  # noqa: SIM115
    with pytest.raises(OSError) as raised:
        events.scalars(10, {"train/loss": 0.5})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(events._writer.path)


def test_train_log_on_a_full_disk_says_so_once_not_a_traceback_a_line(capfd):
    handler = logging.FileHandler("/dev/full")
    root = logging.getLogger()
    root.addHandler(handler)
    logging.getLogger("trainkit").setLevel(logging.INFO)
    try:
        held_log.hold()
        held_log.release()
        for line in range(3):
            logging.getLogger("trainkit").info("line %d", line)
    finally:
        root.removeHandler(handler)
        handler.stream = None  # its buffer holds the lines: closing would flush them into /dev/full again
    err = capfd.readouterr().err
    assert err.count("trainkit: warning: /dev/full could not be written: the disk is full (No space left on "
                     "device); its lines are lost from here") == 1
    assert "Logging error" not in err and "Traceback" not in err


def test_the_command_on_a_full_disk_is_one_line_naming_the_file_and_status_1(tmp_path):
    """The quick start's command whose metrics.jsonl is on a full disk: the first record ends the run with the one
    line. Mutation caught: without the command's disk_full branch, the crash's traceback on the console."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "trainkit", "recipe=digits_quickstart", "trainer.epochs=1",
         "model._target_=tests.common.full_disk.MetricsOnAFullDisk", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), "TRAINKIT_COMPILE_CACHE": "0"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"trainkit: error: the disk is full (No space left on device): {run_dir / 'metrics.jsonl'} could not be "
        "written; the checkpoints saved before are whole: free some space, then run the command again (with "
        "trainer.resume=auto to continue from the newest checkpoint)")
