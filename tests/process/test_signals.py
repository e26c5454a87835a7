"""trainkit.process.signals: SIGTERM/SIGINT blocked in every thread and forwarded, by name, to the main thread's
handler; children never inherit the block (a child that cannot be stopped would outlive the run)."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainkit.process import signals

BLOCKED_BITS = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def blocked_in(status_text):
    """Which of SIGINT/SIGTERM /proc/PID/status says are blocked (SigBlk: a hex mask, bit N-1 for signal N)."""
    (line,) = [line for line in status_text.splitlines() if line.startswith("SigBlk:")]
    return int(line.split()[1], 16) & BLOCKED_BITS


@pytest.fixture
def routed():
    previous = {signum: signal.getsignal(signum) for signum in signals.SIGNALS}
    assert signals.route()
    yield
    signals.unroute()
    for signum, handler in previous.items():
        signal.signal(signum, handler)


ROUTED = """
import os, signal, sys, threading, time
from trainkit.process import signals
assert signals.route()  # first, as the command does: no thread exists yet that could take a signal itself
got = []
for signum in signals.SIGNALS:
    signal.signal(signum, lambda number, frame: got.append(number))
threading.Thread(target=time.sleep, args=(0.01,)).start()  # a later thread inherits the block
for count, signum in enumerate((signal.SIGINT, signal.SIGTERM), start=1):
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # bytecodes run between waits: the forwarded handler runs there
print(" ".join(signal.Signals(number).name for number in got))
"""


def test_each_signal_reaches_the_main_threads_handler_as_itself():
    """In a fresh process (as python -m trainkit starts). Mutation caught: the forwarder delivering every signal as
    SIGTERM (what MindSpore's SignalGuard makes of a SIGINT) printed SIGTERM SIGTERM."""
    done = subprocess.run([sys.executable, "-c", ROUTED], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SIGINT", "SIGTERM"]


def test_children_do_not_inherit_the_block(routed):
    """A command started inside unblocked() (msrun, by the launcher), and a forked child, take their signals.
    Mutations caught: unblocked() a no-op (the child's SigBlk has both bits: msrun would ignore the launcher's
    SIGINT), and no at-fork hook (a forked worker could not be terminated)."""
    show = [sys.executable, "-c", "print(open('/proc/self/status').read())"]
    assert blocked_in(subprocess.run(show, capture_output=True, text=True).stdout) == BLOCKED_BITS  # the reason
    with signals.unblocked():
        started = subprocess.run(show, capture_output=True, text=True).stdout
    assert blocked_in(started) == 0
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(writing, Path("/proc/self/status").read_bytes())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as stream:
        forked = stream.read().decode()
    os.waitpid(child, 0)
    assert blocked_in(forked) == 0


WAITING = """
import signal, threading, time
from trainkit.process import signals
assert signals.route()
got = []
for signum in signals.SIGNALS:
    signal.signal(signum, lambda number, frame: got.append(number))
print("ready", flush=True)
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    threading.Event().wait(0.01)
print(" ".join(signal.Signals(number).name for number in got) or "nothing", flush=True)
"""


def _state(pid):
    """The process state letter of /proc/PID/stat (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_stop_and_continue_loses_no_signal():
    """Ctrl-Z then ``fg`` (SIGSTOP, SIGCONT) interrupts the forwarding thread's wait with EINTR; CPython's
    ``sigtimedwait`` whose timeout passed meanwhile returns a siginfo it never filled in. The forwarder must outlive
    that and still deliver the SIGTERM that follows. Mutation caught: back to ``sigtimedwait(SIGNALS, 0.05)`` (the
    code before issue 30): the thread died on ``ValueError: signal number out of range`` and the child printed
    ``nothing``."""
    child = subprocess.Popen([sys.executable, "-c", WAITING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        for _ in range(3):
            os.kill(child.pid, signal.SIGSTOP)
            while _state(child.pid) != "T":
                threading.Event().wait(0.01)
            threading.Event().wait(4 * signals._POLL_SECONDS)  # the input: stopped longer than a wait's timeout
            os.kill(child.pid, signal.SIGCONT)
            while _state(child.pid) == "T":
                threading.Event().wait(0.01)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err[-2000:]
    assert out == "SIGTERM\n", err[-2000:]


def test_finish_returns_a_signal_that_came_while_only_the_hold_handlers_were_there():
    """A signal after the command put back the hold handlers (its work done) is not lost: finish() returns it, taken
    by the forwarder or still pending when routing stops, and the second finish() (cli's) returns None. Mutation
    caught: finish() returning None (the signal was held and forgotten: exit 0)."""
    previous = {signum: signal.getsignal(signum) for signum in signals.SIGNALS}
    try:
        signals.start()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # blocked here: pending until finish()
        assert signals.finish() == signal.SIGTERM
        assert signals.held() is None
        assert signals.finish() is None
        assert {signum: signal.getsignal(signum) for signum in signals.SIGNALS} == previous
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_finish_returns_a_signal_the_forwarder_took_and_had_not_delivered(monkeypatch):
    """The forwarder holds a signal it took while the main thread imports (and for a moment between taking and
    delivering any): finish() joins it and counts what it still holds. Mutation caught: finish() clearing the
    forwarder's pending signals unread (seen once in a CI run: python -m trainkit's main() then exited 0)."""
    previous = {signum: signal.getsignal(signum) for signum in signals.SIGNALS}
    monkeypatch.setattr(signals, "_importing", lambda main_ident: True)  # the forwarder keeps what it holds
    try:
        signals.start()
        # As the forwarder leaves a signal it took (a real one may reach a thread of an earlier test's that started
        # before the routing and so does not block it: this process is a test worker, not a fresh command).
        with signals._taking:
            signals._pending.append(signal.SIGTERM)
        assert signals.finish() == signal.SIGTERM
        # Answered once: held() stays None for the next command in this process. A stale answer stopped a later
        # in-process command at its start ("stopped by SIGTERM outside the training loop"), in a CI run where this
        # test and tests/app/test_compose_once.py shared a worker.
        assert signals.held() is None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_signal_after_the_commands_work_is_one_line_and_143(monkeypatch, capsys):
    """python -m trainkit's main(): a SIGTERM that lands after _main() put back the hold handlers (the window between
    the run's end and the process's) still ends the command with the one line and 143. Mutation caught: main()
    without its check of finish()'s answer (exit 0, nothing printed)."""
    import trainkit.__main__ as command

    # To the main thread, which blocks it until finish() (a process-wide one may reach a thread an earlier test
    # started before the routing, whose handler then runs whenever that thread is scheduled).
    monkeypatch.setattr(command, "_main", lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM))
    with pytest.raises(SystemExit) as ended:
        command.main()
    assert ended.value.code == 143
    assert capsys.readouterr().err == ("trainkit: stopped by SIGTERM outside the training loop, after the command had "
                                       "done its work (what it wrote is complete)\n")


@pytest.mark.parametrize("orig_argv,package", [
    (["python", "-m", "trainkit", "-m", "model=mlp"], "trainkit"),
    (["python", "-X", "importtime", "-W", "ignore", "-m", "trainkit"], "trainkit"),
    (["python", "-Ximporttime", "-Bm", "myproject.sub", "x"], "myproject.sub"),
    (["python", "-mtrainkit"], "trainkit"),
    (["python", "-c", "import trainkit", "-m", "trainkit"], None),
    (["python", "script.py", "-m", "trainkit"], None),
    (["python", "-", "-m", "trainkit"], None),
    (["python", "-I"], None),
])
def test_command_package_reads_the_interpreters_options(monkeypatch, orig_argv, package):
    """The module ``python -m`` runs, from the interpreter's own command line: only then is the command the process
    (trainkit/__init__.py routes the signals, __main__ may end the process). Mutation caught: a parser that took the
    first argument not starting with ``-`` as the end of the options (``-X importtime`` read as a script: None)."""
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert signals.command_package() == package


COMPLETING = """
import os, sys, time
from pathlib import Path
from trainkit.process import signals
signals.start()
assert signals.own_process(lambda signum, done: print(f"farewell {signum} {done}", file=sys.stderr, flush=True))
marker, gate, written = (Path(name) for name in sys.argv[1:])
with signals.completing():
    marker.write_text("in")
    while not gate.exists():
        time.sleep(0.01)
    written.write_text("whole")
time.sleep(60)  # a safety net: the forwarder ends the process as soon as the block is done
"""


def test_a_signal_waits_for_a_completing_block_then_ends_the_process(tmp_path):
    """An owning command's write inside ``completing()`` is finished before the forwarding thread ends the process
    (128 + N, the farewell called once). Mutation caught: ``completing()`` without its lock (the process ended at
    once, while the write waited for its gate: no file written)."""
    marker, gate, written = tmp_path / "marker", tmp_path / "gate", tmp_path / "written"
    child = subprocess.Popen([sys.executable, "-c", COMPLETING, str(marker), str(gate), str(written)],
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        while not marker.exists() and child.poll() is None:  # wait on the disk
            threading.Event().wait(0.01)
        child.send_signal(signal.SIGTERM)
        while child.poll() is None and not _taken(child.pid):  # its forwarding thread has it: waits on the block
            threading.Event().wait(0.01)
        gate.write_text("go")
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, err
    assert err == "farewell 15 False\n"
    assert written.read_text() == "whole"


def _taken(pid):
    """Whether SIGTERM is no longer pending in the process (its forwarding thread has taken it)."""
    status = Path(f"/proc/{pid}/status").read_text()
    (shared,) = [line for line in status.splitlines() if line.startswith("ShdPnd:")]
    return not int(shared.split()[1], 16) & (1 << (signal.SIGTERM - 1))


IGNORED_AT_START = """
import os, signal, sys, threading, time
from trainkit.process import signals
signals.start()  # as python -m trainkit does, with SIGINT ignored by whoever started the process
got = []
for signum in signals.SIGNALS:
    signal.signal(signum, lambda number, frame: got.append(number))
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGTERM)  # both pending at once: the forwarder takes SIGINT (2) first
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    threading.Event().wait(0.01)
signals.finish()
print(" ".join(signal.Signals(number).name for number in got))
"""


def test_a_signal_ignored_when_the_process_started_stays_ignored():
    """A shell's background job (``cmd &`` in a script) starts with SIGINT ignored so that Ctrl-C reaches only the
    foreground; routing blocks the signal, which queues it instead of dropping it, and a Ctrl-C meant for another
    process stopped trainkit (exit 130). Mutation tried: the ignored set left empty: SIGINT came first."""
    done = subprocess.run([sys.executable, "-c", IGNORED_AT_START], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SIGTERM"]


OWNED_WRITE = """
import sys, time
from pathlib import Path
from trainkit.process import signals
signals.start()  # as python -m trainkit.<tool> does, from the package's first import
from trainkit.process import tool_command
from trainkit.rundir.output_file import written_whole
assert signals.own_process(tool_command._farewell, tool_command._stop)

def main():
    with written_whole(Path(sys.argv[1]) / "model.mindir", ".mindir") as temporary:
        temporary.write_bytes(b"partial")
        print("writing", flush=True)
        time.sleep(60)  # a safety net: the signal ends the process from trainkit's thread
    return 0

tool_command.tool_status(main)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_tool_that_owns_its_process_removes_the_temporary_file_when_a_signal_ends_it(tmp_path, signum):
    """The command's process is ended by the signal thread (``os._exit``: the write's ``finally`` never runs),
    so the temporary output is removed by that thread. Mutation caught: _exit_for without its unlink of
    ``removed_if_ended``'s files (red: ``.model.mindir.<pid>.tmp.mindir`` left)."""
    child = subprocess.Popen([sys.executable, "-c", OWNED_WRITE, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert child.stdout.readline() == "writing\n"  # the temporary file is there
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 128 + signum, err
    assert err == (f"trainkit: stopped by {signal.Signals(signum).name}: nothing was written (an output written "
                   "before it is whole)\n")
    assert list(tmp_path.iterdir()) == []
