"""``python -m trainkit ... parallel.workers=N``: the same command once more on N worker processes, started by msrun.

The launcher does not spawn workers itself: it runs ``msrun`` (MindSpore's dynamic-cluster launcher) with the
interpreter's directory first on PATH (msrun starts the first ``python`` there), the same overrides and a fixed
``hydra.run.dir``, so every rank of this machine shares one run directory. It then follows rank 0's log on the
console and waits. A worker that fails ends the job: msrun kills the other workers, the launcher stops msrun's
scheduler (which would otherwise wait for the dead worker's heartbeat to time out) and returns the worker's exit
status with the last lines of its log. Every process msrun started is gone when :func:`launch_workers` returns.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil
from omegaconf import DictConfig

from trainkit import signals
from trainkit.checks import choice
from trainkit.distributed.parallel import check_parallel, close_log_files, launched_by_msrun
from trainkit.errors import ConfigError, RunDirectoryInUse
from trainkit.rundir.command import command_flags, forwarded_hydra_overrides, hydra_quoted
from trainkit.rundir.lock import RunDirectoryLock, launcher_marker

log = logging.getLogger("trainkit")

LOG_DIR = "msrun_logs"  # inside the run directory: msrun's scheduler.log and worker_<rank>.log
TAIL_LINES = 20
_WORKER_FAILED = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
_NATIVE_LOG_LINE = re.compile(r"\[(DEBUG|INFO|WARNING)\] [A-Z_]+\(")  # MindSpore's C++ logs, in the file only
_POLL_SECONDS = 0.2
_GRACE_SECONDS = 10.0  # for msrun to stop its workers itself, and for processes to exit after SIGTERM
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
WORKER_PIDS = "TRAINKIT_WORKER_PIDS"  # the folder where each worker of a trainkit launcher writes rank-<rank>.pid


def needs_launch(parallel) -> bool:
    """True when this command should start msrun: several workers asked for, and no msrun around us yet."""
    return parallel.workers * parallel.nodes > 1 and not launched_by_msrun()


def launch_workers(cfg: DictConfig) -> int:
    """Run this command on ``parallel.workers`` processes of this machine through msrun, wait.

    Call it from inside the Hydra app (``python -m trainkit``): the overrides and the run directory are Hydra's.

    Returns:
        0 when every worker succeeded; else the failing worker's exit status (1 if msrun failed by itself).

    Raises:
        ConfigError: a value that cannot run, found before any process starts.
    """
    from hydra.core.hydra_config import HydraConfig

    check_parallel(cfg.parallel, _device_target(choice(cfg.trainer.device_target)))
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir).resolve()
    arguments = ["-m", "trainkit", *command_flags(sys.argv[1:]), *hydra_cfg.overrides.task,
                 *forwarded_hydra_overrides(hydra_cfg.overrides.hydra), f"hydra.run.dir={hydra_quoted(str(run_dir))}"]
    with RunDirectoryLock(run_dir) as lock:  # the launcher holds the run directory for the whole job
        lock.acquire()
        return run_msrun(cfg.parallel, arguments, run_dir, resuming=cfg.trainer.resume is not None, lock=lock)


def run_msrun(parallel, arguments: Sequence[str], run_dir: Path, resuming: bool = False,
              lock: Optional[RunDirectoryLock] = None) -> int:
    """``msrun ... python ARGUMENTS`` with msrun's logs in ``run_dir/msrun_logs``; rank 0's log is shown as it grows.

    When `resuming`, the logs of the run's earlier jobs are moved to ``msrun_logs-<n>/`` (kept, not overwritten).
    With `lock` (held), the workers are told that this process holds the run directory for them.

    Returns:
        The job's exit status (see :func:`launch_workers`).
    """
    log_dir = run_dir / LOG_DIR
    if log_dir.exists() and not resuming:
        raise RunDirectoryInUse(f"{run_dir} already holds a data-parallel run ({LOG_DIR}/): nothing was changed "
                                "there; choose a new directory with hydra.run.dir=PATH, or continue it with "
                                "trainer.resume=auto")
    if lock is not None:
        lock.commit()
    if log_dir.exists():
        number = 1
        while (run_dir / f"{LOG_DIR}-{number}").exists():
            number += 1
        log_dir.rename(run_dir / f"{LOG_DIR}-{number}")
    port = parallel.master_port if parallel.master_port is not None else free_port(parallel.master_addr)
    first_local_rank = parallel.node_rank * parallel.workers
    command = [_msrun_executable(), f"--worker_num={parallel.workers * parallel.nodes}",
               f"--local_worker_num={parallel.workers}", f"--node_rank={parallel.node_rank}",
               f"--master_addr={parallel.master_addr}", f"--master_port={port}", f"--log_dir={log_dir}",
               "--join=True", f"--tail_worker_log={parallel.workers + 1}",  # no rank: the launcher shows the log
               "python", *arguments]
    interpreter_dir = os.path.dirname(sys.executable)
    log_dir.mkdir(parents=True)
    env = dict(os.environ, PATH=interpreter_dir + os.pathsep + os.environ.get("PATH", ""),
               **{WORKER_PIDS: str(log_dir)}, **(launcher_marker() if lock is not None and lock.held else {}))
    close_log_files()  # rank 0 writes train.log; the launcher's own lines go to the console
    log.info("starting %d worker(s) of %d on this machine through msrun (%s:%d); per-rank logs in %s",
             parallel.workers, parallel.workers * parallel.nodes, parallel.master_addr, port, log_dir)
    job = _MsrunJob(command, env, log_dir / f"worker_{first_local_rank}.log")
    return job.run()


def note_worker_pid() -> None:
    """In a worker of a trainkit launcher, write this process's pid to ``rank-<RANK_ID>.pid`` in the job's log folder.

    A worker that fails at once can be gone before the launcher's next look at msrun's processes; msrun's failure
    line names only its pid, and this file turns it into the rank (and the log) the launcher reports.
    """
    folder, rank = os.environ.get(WORKER_PIDS), os.environ.get("RANK_ID")
    if not folder or rank is None or not rank.isdigit():
        return
    with contextlib.suppress(OSError):
        Path(folder, f"rank-{rank}.pid").write_text(str(os.getpid()))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (msrun's scheduler binds it a moment later)."""
    low, high = 1024, 65535
    with socket.socket() as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            sock.bind(("", 0))
        port = sock.getsockname()[1]
    return port if low <= port <= high else free_port(host)


# ------------------------------------------------------------------------------------------------ the job
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

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)
        workers = [self._seen[pid] for pid in self._ranks if self._alive(pid)]
        if len(self.signals) > 1 or not workers:
            raise KeyboardInterrupt
        for worker in workers:  # in sessions of their own: a terminal's Ctrl-C reaches only the launcher
            with contextlib.suppress(psutil.Error):
                worker.send_signal(signum)

    def run(self) -> int:
        with signals.unblocked():  # msrun inherits the mask of the thread that starts it (trainkit/signals.py)
            process = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True)  # its own group: msrun, scheduler, tails
        reader = threading.Thread(target=self._read_msrun, args=(process,), daemon=True)
        reader.start()
        interrupted = False
        # The first SIGTERM/SIGINT goes to every worker (they stop after the same step, rank 0 writes a checkpoint);
        # a second one, or one before any worker runs, stops the whole job at once.
        previous_handlers = {signum: signal.signal(signum, self._on_signal) for signum in _STOP_SIGNALS}
        try:
            while process.poll() is None:
                self._watch(process)
                if self.failure is not None:
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
        self._report_failure(process.returncode)
        if self.failure is not None:
            return self.failure.status if self.failure.status > 0 else 128 - self.failure.status
        return process.returncode or 1

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
def _msrun_executable() -> str:
    msrun = shutil.which("msrun", path=os.path.dirname(sys.executable)) or shutil.which("msrun")
    if msrun is None:
        raise ConfigError("parallel.workers > 1 needs msrun, which comes with mindspore, next to the interpreter "
                          f"{sys.executable} or on PATH: reinstall mindspore there")
    return msrun


def _device_target(configured: str) -> str:
    if configured != "auto":
        return configured
    import mindspore as ms

    return ms.get_context("device_target")


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
