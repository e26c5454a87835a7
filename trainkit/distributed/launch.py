"""``python -m trainkit ... parallel.workers=N``: the same command once more on N worker processes, started by msrun.

The launcher does not spawn workers itself: it runs ``msrun`` (MindSpore's dynamic-cluster launcher) with the
interpreter's directory first on PATH (msrun starts the first ``python`` there), the same overrides and a fixed
``hydra.run.dir``, so every rank of this machine shares one run directory. It then follows rank 0's log on the
console and waits (:mod:`trainkit.distributed.msrun_job`). A worker that fails ends the job: msrun kills the other
workers, the launcher stops msrun's scheduler (which would otherwise wait for the dead worker's heartbeat to time
out) and returns the worker's exit status with the last lines of its log. Every process msrun started is gone when
:func:`launch_workers` returns.

With ``parallel.nodes`` > 1 the launchers of the machines meet first (:mod:`trainkit.distributed.machines`); with
``parallel.max_restarts`` = N a job whose worker failed starts again with ``trainer.resume=auto``, up to N times.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from omegaconf import DictConfig

from trainkit.checks import choice
from trainkit.distributed.machines import MachineJob, log_dir_name, meet
from trainkit.distributed.msrun_job import (  # noqa: F401 (the job's names, where they were)
    TAIL_LINES,
    _Failure,
    _MsrunJob,
    _rank_of_the_only_failing_log,
)
from trainkit.distributed.parallel import WORKER_PIDS, check_parallel, close_log_files, launched_by_msrun
from trainkit.errors import ConfigError, RunDirectoryInUse
from trainkit.rundir.command import command_flags, forwarded_hydra_overrides, hydra_quoted
from trainkit.rundir.lock import RunDirectoryLock, launcher_marker

log = logging.getLogger("trainkit")

LOG_DIR = "msrun_logs"  # inside the run directory: msrun's scheduler.log and worker_<rank>.log (machine 0's)
_RESUME_KEYS = ("trainer.resume=", "+trainer.resume=", "++trainer.resume=")


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
        PeersMissing: with several machines, peers that did not join within ``parallel.join_timeout``.
    """
    from hydra.core.hydra_config import HydraConfig

    parallel = cfg.parallel
    check_parallel(parallel, _device_target(choice(cfg.trainer.device_target)))
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir).resolve()
    arguments = ["-m", "trainkit", *command_flags(sys.argv[1:]), *hydra_cfg.overrides.task,
                 *forwarded_hydra_overrides(hydra_cfg.overrides.hydra), f"hydra.run.dir={hydra_quoted(str(run_dir))}"]
    resume = cfg.trainer.resume
    status = 0
    for attempt in range(parallel.max_restarts + 1):
        if attempt:  # a worker was lost: the same job again, from the newest checkpoint
            arguments = with_resume(arguments, "auto")
            resume = "auto"
        with contextlib.ExitStack() as stack:
            machine = stack.enter_context(meet(cfg, run_dir, resume, attempt)) if parallel.nodes > 1 else None
            if machine is None:
                lock = stack.enter_context(RunDirectoryLock(run_dir))  # held for the whole job
                lock.acquire()
            else:
                lock = machine.lock
            job_arguments = with_resume(arguments, machine.resume_path) if machine and machine.resume_path \
                else arguments
            status, cause = run_msrun(parallel, job_arguments, run_dir, resuming=resume is not None or attempt > 0,
                                      lock=lock if lock.held else None, machine=machine)
        if not cause or attempt == parallel.max_restarts:
            return status
        log.warning("restart %d of parallel.max_restarts=%d: %s; starting the job again with trainer.resume=auto",
                    attempt + 1, parallel.max_restarts, cause)
    return status


def with_resume(arguments: Sequence[str], resume: str) -> List[str]:
    """`arguments` with ``trainer.resume`` set to `resume` (any earlier value of it dropped)."""
    return [a for a in arguments if not a.startswith(_RESUME_KEYS)] + [f"trainer.resume={hydra_quoted(resume)}"]


def run_msrun(parallel, arguments: Sequence[str], run_dir: Path, resuming: bool = False,
              lock: Optional[RunDirectoryLock] = None, machine: Optional[MachineJob] = None) -> "tuple[int, str]":
    """``msrun ... python ARGUMENTS`` with msrun's logs in ``run_dir/msrun_logs``; rank 0's log is shown as it grows.

    When `resuming`, the logs of the run's earlier jobs are moved to ``msrun_logs-<n>/`` (kept, not overwritten).
    With `lock` (held), the workers are told that this process holds the run directory for them. With `machine`
    (several machines), the other machines' launchers can stop this job, and are told when it fails.

    Returns:
        The job's exit status (see :func:`launch_workers`), and why it failed when a restart may help (a worker
        lost, another machine's job stopped), else "".
    """
    log_name = log_dir_name(parallel.node_rank, parallel.nodes)
    log_dir = run_dir / log_name
    if log_dir.exists() and not resuming:
        raise RunDirectoryInUse(f"{run_dir} already holds a data-parallel run ({log_name}/): nothing was changed "
                                "there; choose a new directory with hydra.run.dir=PATH, or continue it with "
                                "trainer.resume=auto")
    if lock is not None:
        lock.commit()
    if log_dir.exists():
        number = 1
        while (run_dir / f"{log_name}-{number}").exists():
            number += 1
        log_dir.rename(run_dir / f"{log_name}-{number}")
    port = parallel.master_port if parallel.master_port is not None else free_port(parallel.master_addr)
    first_local_rank = parallel.node_rank * parallel.workers
    command = [_msrun_executable(), f"--worker_num={parallel.workers * parallel.nodes}",
               f"--local_worker_num={parallel.workers}", f"--node_rank={parallel.node_rank}",
               f"--master_addr={parallel.master_addr}", f"--master_port={port}", f"--log_dir={log_dir}",
               "--join=True", f"--tail_worker_log={parallel.workers + 1}",  # no rank: the launcher shows the log
               f"--cluster_time_out={int(parallel.join_timeout) + 30}",  # the launcher's own limit comes first
               "python", *arguments]
    interpreter_dir = os.path.dirname(sys.executable)
    log_dir.mkdir(parents=True)
    env = dict(os.environ, PATH=interpreter_dir + os.pathsep + os.environ.get("PATH", ""),
               **{WORKER_PIDS: str(log_dir)}, **(launcher_marker() if lock is not None and lock.held else {}))
    close_log_files()  # rank 0 writes train.log; the launcher's own lines go to the console
    log.info("starting %d worker(s) of %d on this machine through msrun (%s:%d); per-rank logs in %s",
             parallel.workers, parallel.workers * parallel.nodes, parallel.master_addr, port, log_dir)
    job = _MsrunJob(command, env, log_dir / f"worker_{first_local_rank}.log", local_workers=parallel.workers,
                    join_timeout=parallel.join_timeout, join_place=f"{parallel.master_addr}:{port}",
                    stop_requested=machine.meeting.stopped_elsewhere if machine is not None else None)
    status = job.run()
    again = restartable(status, job.signals, job.failure, job.stopped_by)
    if machine is not None:
        if status == 0:
            machine.meeting.tell_done()
        elif job.stopped_by is None:  # this machine's own end: the others stop too
            machine.meeting.tell_stop(f"machine {parallel.node_rank}: {job.cause()}" if again
                                      else f"machine {parallel.node_rank}'s job ended with exit status {status}")
    return status, job.cause() if again else ""


def restartable(status: int, signals: Sequence[int], failure: Optional[_Failure], stopped_by: Optional[str]) -> bool:
    """Whether ``parallel.max_restarts`` may start a job that ended so again: a worker lost (or another machine's),
    not a job stopped on purpose (a signal to the launcher, or a worker ended by SIGTERM/SIGINT: a grace period)."""
    if status == 0 or signals:
        return False
    if stopped_by is not None:
        return True
    return failure is not None and failure.status not in (128 + signal.SIGTERM, 128 + signal.SIGINT,
                                                          -signal.SIGTERM, -signal.SIGINT)


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
