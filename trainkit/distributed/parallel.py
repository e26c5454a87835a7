"""The parallel context of one worker process: config checks, ``mindspore.communication.init`` and
``set_auto_parallel_context``, data preparation in stages, the learning-rate scaling rule and the job-wide report.

Starting the worker processes is msrun's job; ``trainkit/distributed/launch.py`` runs it for ``python -m trainkit``.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import mindspore as ms

from trainkit.checks import choice
from trainkit.errors import ConfigError, DataError
from trainkit.rundir import held_log

log = logging.getLogger("trainkit")

_PARALLEL_MODES = {
    "data_parallel": ms.ParallelMode.DATA_PARALLEL,
    "semi_auto_parallel": ms.ParallelMode.SEMI_AUTO_PARALLEL,
    "auto_parallel": ms.ParallelMode.AUTO_PARALLEL,
    "hybrid_parallel": ms.ParallelMode.HYBRID_PARALLEL,
}
_OPERATOR_SHARDING_MODES = ("semi_auto_parallel", "auto_parallel")  # MindSpore runs these on Ascend and GPU only
MSRUN_PORTS = (1024, 65535)  # msrun's --master_port range
WORKER_PIDS = "TRAINKIT_WORKER_PIDS"  # the job's log folder, where a launcher's workers write rank-/joined-<rank>


@dataclass(frozen=True)
class ParallelSetup:
    """Where this process stands in the job: its rank among ``group_size`` workers."""

    rank: int = 0
    group_size: int = 1

    @property
    def writer(self) -> bool:
        """The one rank that writes the config, metrics, TensorBoard events, progress, logs and checkpoints."""
        return self.rank == 0


_current = ParallelSetup()


def current_setup() -> ParallelSetup:
    """This process's place in the job as ``setup_parallel`` set it (rank 0 of 1 before): for users' callbacks,
    which run on every rank, to know their ``rank`` and whether they are the ``writer``."""
    return _current


def launched_by_msrun() -> bool:
    """Whether this process belongs to a MindSpore dynamic cluster (msrun sets MS_ROLE)."""
    return bool(os.environ.get("MS_ROLE"))


def check_parallel(parallel: Any, device_target: Optional[str] = None) -> None:
    """Raise ConfigError naming the first ``parallel.*`` key whose value cannot run, and what is valid.

    Args:
        parallel: the ``parallel`` config node.
        device_target: the device MindSpore runs on (``CPU``, ``GPU``, ``Ascend``); None skips the device check.
    """
    mode = choice(parallel.mode)
    if mode != "stand_alone" and mode not in _PARALLEL_MODES:
        raise ConfigError(f"parallel.mode={mode!r} is not valid: use stand_alone or one of "
                          f"{', '.join(_PARALLEL_MODES)}")
    _check_int("parallel.workers", parallel.workers, 1, None, "an integer >= 1 (worker processes on this machine)")
    _check_int("parallel.nodes", parallel.nodes, 1, None, "an integer >= 1 (machines)")
    _check_int("parallel.node_rank", parallel.node_rank, 0, parallel.nodes - 1,
               f"an integer in [0, parallel.nodes - 1] = [0, {parallel.nodes - 1}] (this machine's index)")
    if parallel.master_port is not None:
        low, high = MSRUN_PORTS
        _check_int("parallel.master_port", parallel.master_port, low, high,
                   f"null (a free port, one machine only) or a port in [{low}, {high}]")
    _check_int("parallel.max_restarts", parallel.get("max_restarts", 0), 0, None,
               "an integer >= 0 (times a job whose worker was lost starts again)")
    join_timeout = parallel.get("join_timeout", 300.0)
    if isinstance(join_timeout, bool) or not isinstance(join_timeout, (int, float)) or not join_timeout > 0:
        shown = f"{join_timeout:g}" if isinstance(join_timeout, (int, float)) else join_timeout
        raise ConfigError(f"parallel.join_timeout={shown} is not valid: it must be a number of seconds > 0")
    if parallel.nodes > 1 and parallel.master_port is not None and parallel.master_port >= MSRUN_PORTS[1]:
        raise ConfigError(f"parallel.master_port={parallel.master_port} is not valid with parallel.nodes > 1: the "
                          f"launchers meet on master_port + 1, so it must be below {MSRUN_PORTS[1]}")
    if not isinstance(parallel.master_addr, str) or not parallel.master_addr.strip():
        raise ConfigError(f"parallel.master_addr={parallel.master_addr!r} is not valid: it must be the IP address "
                          "or host name of machine 0 (parallel.node_rank=0)")
    if parallel.nodes > 1 and parallel.master_port is None:
        raise ConfigError(f"parallel.master_port is not set: with parallel.nodes={parallel.nodes} every machine must "
                          "name the same free port of machine 0, e.g. parallel.master_port=8118")
    if mode == "stand_alone" and parallel.workers * parallel.nodes > 1:
        name = "workers" if parallel.workers > 1 else "nodes"
        raise ConfigError(f"parallel.{name}={getattr(parallel, name)} needs a parallel mode: add "
                          "parallel=data_parallel (or hybrid_parallel, semi_auto_parallel, auto_parallel)")
    if device_target == "CPU" and mode in _OPERATOR_SHARDING_MODES:
        raise ConfigError(f"parallel.mode={mode} runs on Ascend and GPU only (MindSpore's operator sharding); "
                          "on CPU use parallel=data_parallel or hybrid_parallel")


def setup_parallel(parallel: Any) -> ParallelSetup:
    """Check the ``parallel`` config, initialise communication once and set the auto-parallel context.

    ``stand_alone`` touches nothing. On every rank but 0, file handlers of the root logger (Hydra's
    ``train.log``) are closed: rank 0 writes the run's log, the others' go to msrun's per-rank worker logs.

    Raises:
        ConfigError: a value that cannot run, or a mode that does not match how the process was started.
    """
    global _current
    mode = choice(parallel.mode)
    check_parallel(parallel, ms.get_context("device_target"))
    if mode == "stand_alone":
        if launched_by_msrun():
            raise ConfigError("parallel.mode=stand_alone, but msrun started this process as one of several workers "
                              "(which would all write the same run): add parallel=data_parallel")
        _current = ParallelSetup()
        return _current
    if not launched_by_msrun():
        raise ConfigError(f"parallel.mode={mode} needs one process per device started by msrun: run "
                          f"`python -m trainkit parallel={mode} parallel.workers=N ...` (it starts msrun), or start "
                          f"this command under msrun yourself; or use parallel=stand_alone")
    from mindspore.communication import get_group_size, get_rank, init

    init()
    note_worker_joined()
    setup = _current = ParallelSetup(rank=get_rank(), group_size=get_group_size())
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode=_PARALLEL_MODES[mode], gradients_mean=parallel.gradients_mean,
                                 device_num=setup.group_size)
    requested = parallel.workers * parallel.nodes
    if requested > 1 and requested != setup.group_size:
        log.warning("parallel.workers x parallel.nodes = %d, but msrun started %d workers: the job runs on %d",
                    requested, setup.group_size, setup.group_size)
    if not setup.writer:
        close_log_files()
    return setup


def note_worker_joined() -> None:
    """In a worker of a trainkit launcher: ``joined-<RANK_ID>`` in the job's log folder, once communication is up
    (the launcher stops workers that have not joined at once: they cannot run a signal handler before)."""
    folder, rank = os.environ.get(WORKER_PIDS), os.environ.get("RANK_ID")
    if folder and rank is not None and rank.isdigit():
        with contextlib.suppress(OSError):
            Path(folder, f"joined-{rank}").write_text(str(os.getpid()))


def prepare_data(data: Any, setup: ParallelSetup) -> None:
    """``data.prepare()`` on every rank, in stages, so only one process per machine may download.

    Rank 0 goes first (it may download); then the first worker of each other machine (msrun's
    ``DEVICE_ID=0``), for machines that do not share rank 0's file system; then everyone else, who only
    checks the files. A failure in a stage stops every rank after that stage, not only the failing one.
    """
    if setup.group_size == 1:
        data.prepare()
        return
    stage = 0 if setup.rank == 0 else 1 if os.environ.get("DEVICE_ID") == "0" else 2
    for current in range(3):
        error: Optional[BaseException] = None
        if stage == current:
            try:
                data.prepare()
            except Exception as caught:  # re-raised below, once every rank knows
                error = caught
        failures = _count_over_ranks(error is not None)
        if error is not None:
            raise error
        if failures:
            raise DataError(f"the data could not be prepared on {failures} other rank(s) (see rank 0's train.log "
                            "or msrun's worker logs); this rank stops too")


def scaled_learning_rate(lr: float, parallel: Any, setup: ParallelSetup) -> float:
    """``optimizer.lr`` for the whole job: as given (``none``) or times the number of workers (``linear``)."""
    return lr * setup.group_size if choice(parallel.lr_scaling) == "linear" else lr


def describe_job(parallel: Any, setup: ParallelSetup, batch_size: int, accumulation_steps: int,
                 base_lr: float, lr: float) -> str:
    """One log line with the job-wide batch and learning rate."""
    per_step = batch_size * setup.group_size
    text = (f"{choice(parallel.mode)}: {setup.group_size} worker(s) ({parallel.nodes} machine(s)), global batch "
            f"{per_step * accumulation_steps} per optimizer update ({batch_size} per rank x {setup.group_size} "
            f"rank(s) x {accumulation_steps} accumulation step(s))")
    rule = choice(parallel.lr_scaling)
    if rule == "linear":
        return f"{text}, learning rate {lr:g} (optimizer.lr {base_lr:g} x {setup.group_size} workers, linear scaling)"
    return f"{text}, learning rate {lr:g} (optimizer.lr, parallel.lr_scaling=none)"


def job_metrics(setup: ParallelSetup, batch_size: int, accumulation_steps: int) -> dict:
    """Final metrics of the whole job that one process's metrics do not say."""
    return {"workers": float(setup.group_size),
            "global_batch_size": float(batch_size * setup.group_size * accumulation_steps)}


def close_log_files() -> None:
    """Close the root logger's file handlers (Hydra's train.log): for processes that must not write it."""
    held_log.discard()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            handler.close()


# --------------------------------------------------------------------------- helpers
def _check_int(key: str, value: Any, low: int, high: Optional[int], valid: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise ConfigError(f"{key}={value} is not valid: it must be {valid}")


def _count_over_ranks(flag: bool) -> int:
    """The number of ranks that raised `flag`; every rank waits here for all the others."""
    from mindspore import Tensor, ops

    total = ops.AllReduce()(Tensor([1.0 if flag else 0.0], ms.float32))
    return int(total.asnumpy()[0]) - int(flag)
