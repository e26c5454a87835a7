"""A signal at any moment of ``python -m trainkit.export`` -- its imports, building the network, compiling it,
writing the file, checking it -- ends it with the one documented line and 128 + N, leaves no temporary file beside
the output and no MindSpore dump (``rank_0/om/analyze_fail.ir``) in the working folder (issue 47).

Each test synchronises on the command's own messages: with ``TRAINKIT_SIGNAL_PHASES=hold:PHASE`` it prints
``trainkit: phase PHASE`` and waits there, or (inside MindSpore's compile) a network's constexpr writes a marker file
and waits; the signal is sent once that message is read."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.processes import wait_for_marker

REPO = Path(__file__).resolve().parents[2]
STOPPED = "trainkit: stopped by {}: nothing was written (an output written before it is whole)"


def export(args, cwd, phases=None, **environment):
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), **environment}
    if phases:
        env["TRAINKIT_SIGNAL_PHASES"] = phases
    return subprocess.Popen([sys.executable, "-m", "trainkit.export", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def left_in(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# Each case is a real export process (MindSpore's import alone is ~3 s on the shared cores): build and write hold in
# Python between phases as import and check do, so they run with the slow tests only.
@pytest.mark.parametrize("phase, signum", [("import", signal.SIGINT),
                                           pytest.param("build", signal.SIGTERM, marks=pytest.mark.slow),
                                           ("compile", signal.SIGINT),
                                           pytest.param("write", signal.SIGTERM, marks=pytest.mark.slow),
                                           ("check", signal.SIGINT)])
def test_a_signal_in_each_phase_of_an_export_is_one_line_and_128_plus_n(digits_run, tmp_path, phase, signum):
    """Mutation caught: tool_command without _own_process (the old exception in the main thread): SIGINT in the
    imports was a KeyboardInterrupt traceback, and the write's temporary file is left when SIGTERM's default action
    ends the process there."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    process = export([str(digits_run), str(out / "model.mindir")], work, phases=f"hold:{phase}")
    seen = []
    for line in process.stderr:  # the phases it went through, up to the one it holds in
        seen.append(line.rstrip("\n"))
        if seen[-1] == f"trainkit: phase {phase}":
            break
    assert seen and seen[-1] == f"trainkit: phase {phase}", seen
    process.send_signal(signum)
    stdout, rest = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, rest
    assert rest == STOPPED.format(signal.Signals(signum).name) + "\n"
    assert stdout == ""
    assert left_in(out) == [] and left_in(work) == []  # no temporary file, no compiler dump


def test_a_signal_inside_mindspore_s_compile_leaves_no_dump(digits_run, tmp_path):
    """SIGTERM while MindSpore compiles the network (a constexpr holds the compile). Mutation caught: tool_command
    without _own_process: the exception raised inside the compile (MindSpore's analyze_fail.ir notice, exit 1)."""
    work, out, marker = tmp_path / "work", tmp_path / "out", tmp_path / "compiling"
    work.mkdir()
    process = export([str(digits_run), str(out / "model.mindir"),
                      "model._target_=tests.common.start_up.CompilesUntilSignalledInExport"], work,
                     TRAINKIT_TEST_COMPILE_MARKER=str(marker))
    wait_for_marker(marker, process, seconds=120)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert stderr == STOPPED.format("SIGTERM") + "\n"
    assert left_in(out) == [] and left_in(work) == []


def test_a_signal_after_the_export_s_work_is_not_lost(digits_run, tmp_path):
    """SIGTERM in the command's teardown (``hold:teardown``: an ``atexit`` function of its exit), after the "wrote"
    line: the line that says the work was done, 143, and the file whole. Mutation caught: tool_status returning its
    status to the interpreter's own exit (the signal then read as one before the work was done)."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    process = export([str(digits_run), str(out / "model.mindir")], work, phases="hold:teardown")
    for line in process.stderr:
        if line.rstrip("\n") == "trainkit: phase teardown":
            break
    process.send_signal(signal.SIGTERM)
    stdout, rest = process.communicate(timeout=120)
    assert process.returncode == 143, rest
    assert rest == "trainkit: stopped by SIGTERM after the command had done its work (what it wrote is whole)\n"
    assert stdout.startswith(f"wrote {out / 'model.mindir'}: MINDIR")
    assert left_in(out) == ["model.mindir"] and left_in(work) == []
    import mindspore as ms

    assert ms.load(str(out / "model.mindir")) is not None  # whole: MindSpore reads it back
