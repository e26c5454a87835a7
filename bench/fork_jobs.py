"""Jobs in forked processes, some at a time: ``bench.port_zoo``'s scheduler.

Each job runs in a process of its own, forked from this one (what this process imported, the child has without
importing it again; what the job allocates goes when its process ends). Jobs start in the order given, at most
`parallel` at once, and the next one waits while the memory estimates of the running ones and its own add up
to more than `memory` (it starts anyway when nothing else runs). A job that dies (the out-of-memory killer's
SIGKILL) or outlives `timeout` gets an outcome saying so, never a hang or a lost row.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence


@dataclass
class Job:
    name: str
    memory: float  # bytes: an estimate of the process's peak beyond what it shares with this one
    work: Callable[[], Any]  # runs in the child; what it returns (JSON) comes back


@dataclass
class Outcome:
    name: str
    value: Any = None  # what the job returned; None when it did not finish
    seconds: Optional[float] = None  # wall time of its process; None when it never started
    problem: str = ""  # why there is no value: "killed by SIGKILL", "stopped after 60 s", "not started: ..."
    peak: Optional[float] = None  # bytes: the child's peak resident memory (ru_maxrss, shared pages included)


def run_jobs(jobs: Sequence[Job], parallel: int = 1, memory: float = float("inf"), timeout: Optional[float] = None,
             deadline: Optional[float] = None, finished: Optional[Callable[[Outcome], None]] = None
             ) -> Dict[str, Outcome]:
    """name -> Outcome of every job; `finished` is called with each as it ends. A job not started by `deadline`
    (``time.perf_counter()``) is not started: "not started: ...". Jobs' names must be unique."""
    context = multiprocessing.get_context("fork")
    waiting: List[Job] = list(jobs)
    running: Dict[str, tuple] = {}  # name -> (process, result file, start, job)
    outcomes: Dict[str, Outcome] = {}
    folder = Path(tempfile.mkdtemp(prefix="fork_jobs_"))
    started = 0

    def end(outcome: Outcome) -> None:
        outcomes[outcome.name] = outcome
        if finished is not None:
            finished(outcome)

    try:
        while waiting or running:
            while waiting and len(running) < max(parallel, 1):
                job = waiting[0]
                if deadline is not None and time.perf_counter() > deadline:
                    waiting.pop(0)
                    end(Outcome(job.name, problem="not started: the time budget was spent"))
                    continue
                if running and sum(entry[3].memory for entry in running.values()) + job.memory > memory:
                    break  # in order: the next job waits for memory rather than being overtaken for ever
                waiting.pop(0)
                path = folder / f"{started}.json"
                started += 1
                process = context.Process(target=_child, args=(job.work, path), name=f"job {job.name}", daemon=True)
                process.start()
                running[job.name] = (process, path, time.perf_counter(), job)
            wait = 1.0 if timeout is None else max(0.05, min(
                1.0, min(start + timeout - time.perf_counter() for _, _, start, _ in running.values())))
            multiprocessing.connection.wait([entry[0].sentinel for entry in running.values()], timeout=wait)
            for name, (process, path, start, _) in list(running.items()):
                seconds = time.perf_counter() - start
                if process.is_alive() and (timeout is None or seconds <= timeout):
                    continue
                if process.is_alive():
                    process.kill()
                    process.join()
                    problem = f"stopped after {timeout:g} s (--timeout)"
                else:
                    process.join()
                    problem = _exit_problem(process.exitcode)
                del running[name]
                end(_outcome(name, path, seconds, problem))
    finally:
        for process, _, _, _ in running.values():
            process.kill()
            process.join()
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    return outcomes


def _child(work: Callable[[], Any], path: Path) -> None:
    _die_with_parent()
    value = work()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    path.write_text(json.dumps({"value": value, "peak": peak}), encoding="utf-8")
    sys.stdout.flush()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a killed run leaves no worker behind); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_problem(code: Optional[int]) -> str:
    if code == 0:
        return ""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return f"killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"its process exited with status {code} (its traceback is above)"


def _outcome(name: str, path: Path, seconds: float, problem: str) -> Outcome:
    if not problem and path.is_file():
        found = json.loads(path.read_text(encoding="utf-8"))
        return Outcome(name, found["value"], seconds, "", found["peak"])
    return Outcome(name, None, seconds, problem or "its process ended without a result")


def available_memory() -> float:
    """Bytes this machine can give now (``MemAvailable``), else its physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
