"""trainkit.process.tool_command: a tool's command ends with one line, not a traceback or a stray file, on a full disk
or a signal (the training command's own signal handling is trainkit.process.signals')."""
import errno
import os
import signal
import time

import pytest

from trainkit.process.tool_command import tool_status
from trainkit.rundir.output_file import written_whole


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_write_removes_the_temporary_file_says_so_and_ends_as_128_plus_n(tmp_path, capsys, signum):
    """Mutation caught: without the handlers, SIGTERM killed pytest's worker (the default action) and SIGINT was a
    KeyboardInterrupt traceback; either way the temporary file stayed."""
    output = tmp_path / "model.mindir"

    def main():
        with written_whole(output, ".mindir") as temporary:
            temporary.write_bytes(b"partial")
            os.kill(os.getpid(), signum)
            deadline = time.monotonic() + 30  # the handler raises at the next bytecode: this loop never ends
            while time.monotonic() < deadline:
                pass
        return 0

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert tool_status(main) == 128 + signum
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == (f"trainkit: stopped by {name}: nothing was written (an output written "
                                       "before it is whole)\n")
    assert list(tmp_path.iterdir()) == []
    assert {s: signal.getsignal(s) for s in before} == before  # the process's handlers, back as they were


def test_a_full_disk_is_one_line_and_status_1_and_other_errors_stay_errors(capsys):
    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "runs/model.mindir")

    assert tool_status(full) == 1
    assert capsys.readouterr().err == ("trainkit: error: runs/model.mindir could not be written: the disk is full "
                                       "(No space left on device); nothing partial was left\n")

    def denied():
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "x")

    with pytest.raises(PermissionError):
        tool_status(denied)
    assert tool_status(lambda: 2) == 2

