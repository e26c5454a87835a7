"""One msrun process and everything it starts, followed until all of it has exited (see
:mod:`trainkit.distributed.launch`).

Phases, and what stops them:

* joining: msrun has started the workers, which wait in ``mindspore.communication.init`` until every rank of the
  job has connected to the scheduler. MindSpore's C++ blocks signals' Python handlers there, so a SIGTERM/SIGINT
  ends the job at once (nothing to save yet), and ``parallel.join_timeout`` bounds the wait. Each worker writes
  ``joined-<rank>`` into the job's log folder when its ``init`` returns (:func:`note_worker_joined`).
* training: the first SIGTERM/SIGINT goes to every worker (they stop after the same step, rank 0 writes a
  checkpoint); a second one stops the whole job at once. A worker that fails ends the job; so does another
  machine's launcher that says its job ended (``stop_requested``).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import psutil

from trainkit.process import signals as trainkit_signals

TAIL_LINES = 20
_WORKER_FAILED = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
_NATIVE_LOG_LINE = re.compile(r"\[(DEBUG|INFO|WARNING)\] [A-Z_]+\(")  # MindSpore's C++ logs, in the file only
_POLL_SECONDS = 0.2
_GRACE_SECONDS = 10.0  # for msrun to stop its workers itself, and for processes to exit after SIGTERM
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
JOINED_PREFIX = "joined-"  # joined-<rank>: that worker's communication init returned


@dataclass
class _Failure:
    pid: int
    status: int


@dataclass
class _MsrunJob:
    """One msrun process and everything it starts, followed until all of it has exited."""

    command: List[str]
    env: Dict[str, str]
    shown_log: Path
    failure: Optional[_Failure] = None
    msrun_output: List[str] = field(default_factory=list)
    _ranks: Dict[int, str] = field(default_factory=dict)  # worker pid -> RANK_ID
    _seen: Dict[int, psutil.Process] = field(default_factory=dict)
    _shown_bytes: int = 0
    signals: List[int] = field(default_factory=list)  # the stop signals the launcher received, in order
    local_workers: int = 0  # the workers msrun starts on this machine: the joined-<rank> files to wait for
    join_timeout: Optional[float] = None  # seconds for them to join (None: no limit)
    join_place: str = ""  # msrun's scheduler, address:port, for the messages
    stop_requested: Optional[Callable[[], Optional[str]]] = None  # another machine's reason to stop, or None
    stopped_by: Optional[str] = None  # why the launcher stopped the job itself (a peer, the join timeout)
    _elsewhere: Optional[tuple] = None  # (another machine's reason to stop, when it came)

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)
        workers = [self._seen[pid] for pid in self._ranks if self._alive(pid)]
        if len(self.signals) > 1 or not workers or not self._all_joined():
            raise KeyboardInterrupt  # before init returned, workers cannot run a handler: nothing to save yet
        for worker in workers:  # in sessions of their own: a terminal's Ctrl-C reaches only the launcher
            with contextlib.suppress(psutil.Error):
                worker.send_signal(signum)

    def run(self) -> int:
        with trainkit_signals.unblocked():  # msrun inherits the mask of the thread that starts it (process/signals.py)
            process = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True)  # its own group: msrun, scheduler, tails
        reader = threading.Thread(target=self._read_msrun, args=(process,), daemon=True)
        reader.start()
        interrupted = False
        # The first SIGTERM/SIGINT goes to every worker (they stop after the same step, rank 0 writes a checkpoint);
        # a second one, or one before any worker runs, stops the whole job at once.
        previous_handlers = {signum: signal.signal(signum, self._on_signal) for signum in _STOP_SIGNALS}
        started = time.monotonic()
        try:
            while process.poll() is None:
                self._watch(process)
                if self.failure is not None:
                    self._stop(process)
                    break
                self.stopped_by = self._reason_to_stop(started)
                if self.stopped_by is not None:
                    _signal_group(process, signal.SIGINT)  # msrun's handler kills its workers and the scheduler
                    self._stop(process)
                    break
                time.sleep(_POLL_SECONDS)
        except KeyboardInterrupt:
            interrupted = True
            _signal_group(process, signal.SIGINT)  # msrun's handler kills its workers and the scheduler
            self._stop(process)
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            self._kill_leftovers(process)
            reader.join(timeout=_GRACE_SECONDS)
            self._show_new_log_lines()
        status = 128 + (self.signals[0] if self.signals else signal.SIGINT)
        if interrupted:
            print(f"trainkit: interrupted: the job was stopped at once and its processes are gone (exit status "
                  f"{status})", file=sys.stderr)
            return status
        stopped_by_signal = self.failure is not None and self.failure.status in (128 + signal.SIGTERM,
                                                                                   128 + signal.SIGINT)
        if self.stopped_by is None and self._elsewhere is not None and process.returncode and not stopped_by_signal:
            self.stopped_by = f"the job stopped on another machine: {self._elsewhere[0]}"  # the first cause
        if self.stopped_by is not None:
            print(f"trainkit: error: {self.stopped_by}; this machine's workers were stopped", file=sys.stderr)
            return 1
        if self.failure is None and process.returncode == 0:
            if self.signals:
                print(f"trainkit: {signal.Signals(self.signals[0]).name} came when the workers had no step left to "
                      "stop after: the run finished", file=sys.stderr)
            return 0
        if self.signals:
            print(f"trainkit: {signal.Signals(self.signals[0]).name} forwarded to the workers: they stopped after the "
                  f"same step (rank 0's log above says where, with the command that continues the run); exit status "
                  f"{status}", file=sys.stderr)
            return status
        if stopped_by_signal:
            name = signal.Signals(self.failure.status - 128).name
            print(f"trainkit: the workers stopped after {name} (sent to another machine's launcher, or to a worker "
                  f"here): they stopped after the same step, with rank 0's checkpoint there; exit status "
                  f"{self.failure.status}", file=sys.stderr)
            return self.failure.status
        self._report_failure(process.returncode)
        if self.failure is not None:
            return self.failure.status if self.failure.status > 0 else 128 - self.failure.status
        return process.returncode or 1

    def _all_joined(self) -> bool:
        return len(list(self.shown_log.parent.glob(f"{JOINED_PREFIX}*"))) >= self.local_workers

    def _reason_to_stop(self, started: float) -> Optional[str]:
        """Another machine's job ended, or this machine's workers did not join in time: why, else None."""
        if self.stop_requested is not None and self._elsewhere is None and not self.signals:
            elsewhere = self.stop_requested()  # (after a signal here the workers are stopping already)
            if elsewhere is not None:
                self._elsewhere = (elsewhere, time.monotonic())
        # The workers get a grace period to end by themselves: after a signal elsewhere they stop after the same
        # step as the others; after a failure elsewhere they fail in their next collective, or wait in it.
        if self._elsewhere is not None and time.monotonic() - self._elsewhere[1] > _GRACE_SECONDS:
            return f"the job stopped on another machine: {self._elsewhere[0]}"
        if (self.join_timeout is not None and time.monotonic() - started > self.join_timeout
                and not self._all_joined()):
            return (f"the workers did not all join msrun's cluster within parallel.join_timeout="
                    f"{self.join_timeout:g}s at {self.join_place} (every machine's launcher met first, so a machine "
                    "lost since, or a blocked scheduler port, is the likely cause)")
        return None

    def cause(self) -> str:
        """Why the job ended early, in a few words (for other machines and the restart log)."""
        if self.stopped_by is not None:
            return self.stopped_by
        if self.failure is not None:
            rank = self._ranks.get(self.failure.pid) or _rank_of_pid(self.shown_log.parent, self.failure.pid)
            return f"worker rank {rank if rank is not None else '?'} exited with status {self.failure.status}"
        return "msrun failed"

    def _read_msrun(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.msrun_output.append(line.rstrip("\n"))
            match = _WORKER_FAILED.search(line)
            if match and self.failure is None:
                self.failure = _Failure(pid=int(match.group(1)), status=int(match.group(2)))

    def _watch(self, process: subprocess.Popen) -> None:
        """Remember msrun's processes (for the clean-up and the failing worker's rank); show rank 0's new lines."""
        try:
            for child in psutil.Process(process.pid).children(recursive=True):
                if child.pid not in self._seen:
                    self._seen[child.pid] = child
                    try:
                        environ = child.environ()
                    except (psutil.Error, OSError):
                        continue
                    if environ.get("MS_ROLE") == "MS_WORKER":
                        self._ranks[child.pid] = environ.get("RANK_ID", "?")
        except psutil.Error:
            pass
        self._show_new_log_lines()

    def _show_new_log_lines(self) -> None:
        try:
            with open(self.shown_log, "rb") as stream:
                stream.seek(self._shown_bytes)
                new = stream.read()
        except OSError:
            return
        complete = new[: new.rfind(b"\n") + 1]  # whole lines only; the rest next time
        if complete:
            self._shown_bytes += len(complete)
            lines = complete.decode("utf-8", errors="replace").splitlines(keepends=True)
            sys.stdout.write("".join(line for line in lines if not _NATIVE_LOG_LINE.match(line)))
            sys.stdout.flush()

    def _stop(self, process: subprocess.Popen) -> None:
        """After a failure msrun kills its workers at once, then waits for the scheduler to notice the dead one
        (tens of seconds): let the workers go, then end msrun and its scheduler."""
        self._watch(process)  # every process msrun started, before any of them is signalled
        deadline = time.monotonic() + _GRACE_SECONDS
        while time.monotonic() < deadline and any(self._alive(pid) for pid in self._ranks):
            time.sleep(_POLL_SECONDS)
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()

    def _kill_leftovers(self, process: subprocess.Popen) -> None:
        """Nothing msrun started outlives the launcher (workers run in sessions of their own)."""
        if process.poll() is None:
            _signal_group(process, signal.SIGKILL)
            process.wait()
        leftovers = [p for p in self._seen.values() if _running(p)]
        for child in leftovers:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(leftovers, timeout=_GRACE_SECONDS)

    def _alive(self, pid: int) -> bool:
        return _running(self._seen[pid])

    def _report_failure(self, msrun_status: Optional[int]) -> None:
        log_dir = self.shown_log.parent
        if self.failure is not None:
            rank = (self._ranks.get(self.failure.pid) or _rank_of_pid(log_dir, self.failure.pid)
                    or _rank_of_the_only_failing_log(log_dir))
            what = f"worker rank {rank}" if rank is not None else "a worker"
            headline = (f"{what} (pid {self.failure.pid}) exited with status {self.failure.status}; msrun stopped "
                        "the other workers")
            first = [log_dir / f"worker_{rank}.log"] if rank not in (None, "?") else []
            logs = first + [path for path in _logs_with_errors(log_dir) if path not in first]
        else:
            headline = f"msrun exited with status {msrun_status}"
            logs = _logs_with_errors(log_dir) or sorted(log_dir.glob("*.log"))
        parts = [f"trainkit: error: {headline}."]
        for path in logs:
            parts.append(f"--- the last lines of {path}:")
            parts.extend("    " + line for line in _tail(path))
        if not logs:
            parts.append("--- msrun's output:")
            parts.extend("    " + line for line in self.msrun_output[-TAIL_LINES:])
        print("\n".join(parts), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ helpers
def _rank_of_pid(log_dir: Path, pid: int) -> Optional[str]:
    """The rank whose worker wrote `pid` to ``rank-<rank>.pid`` (see :func:`note_worker_pid`)."""
    for path in sorted(log_dir.glob("rank-*.pid")):
        with contextlib.suppress(OSError):
            if path.read_text().strip() == str(pid):
                return path.stem.split("-", 1)[1]
    return None


def _rank_of_the_only_failing_log(log_dir: Path) -> Optional[str]:
    """The rank whose ``worker_<rank>.log`` alone shows an error: a worker that fails at once may be gone before
    the launcher's next look at msrun's processes, but its log is on disk."""
    ranks = [match.group(1) for match in (re.fullmatch(r"worker_(\d+)\.log", path.name)
                                          for path in _logs_with_errors(log_dir)) if match]
    return ranks[0] if len(ranks) == 1 else None


def _logs_with_errors(log_dir: Path) -> List[Path]:
    markers = ("Traceback", "trainkit: error:", "Error")
    return [p for p in sorted(log_dir.glob("worker_*.log")) if any(m in p.read_text(errors="replace") for m in markers)]


def _tail(path: Path, lines: int = TAIL_LINES) -> List[str]:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as error:
        return [f"(unreadable: {error})"]
    return [line for line in text if not _NATIVE_LOG_LINE.match(line)][-lines:]


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
