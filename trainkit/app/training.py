"""``train(cfg)``: build everything a config describes, check it, train with ``mindspore.train.Model``.

Everything that can be wrong in the input -- values, data files, the model's and the data's
shapes -- is checked before the first step compiles. ``python -m trainkit`` is a thin Hydra main
around this function; scripts and tests call it in-process::

    from trainkit.app import train
    from trainkit.app.config import compose_config
    result = train(compose_config(["recipe=digits_quickstart", "run_dir=/tmp/run"]))
    result.metrics["accuracy"]

``train`` checks the config and locks the run directory; :class:`trainkit.app.run_loop.Run` turns the config into
its plan, builds the parts (``trainkit.app.build``, with their checks) and runs the loop; ``trainkit.app.run``
holds what they use (run directory, context, resume, reporting).
"""
from __future__ import annotations

from omegaconf import DictConfig

from trainkit.app import run
from trainkit.app.config import check_config
from trainkit.app.run_loop import Run, TrainResult
from trainkit.distributed.parallel import launched_by_msrun
from trainkit.rundir.lock import RunDirectoryLock

__all__ = ["train", "TrainResult", "Run"]


def train(cfg: DictConfig) -> TrainResult:
    """Train as `cfg` says and return the final metrics and the built objects.

    Raises:
        ConfigError: a config value is invalid (the message names the key).
        DataError: the data is missing or corrupt (the message names the path).
    """
    # Check the config, lock the run directory; the Run sets up the context and the processes, refuses a directory
    # that holds another run (live: the lock; or finished), builds and checks every part, and only then writes.
    check_config(cfg)
    run_dir = run.run_dir_of(cfg)
    with RunDirectoryLock(run_dir) as lock:  # released when the run ends, however it ends
        if not launched_by_msrun():
            lock.acquire()  # before anything is written; under msrun rank 0 takes it below, or the launcher has it
        return Run(cfg, run_dir, lock).fit()
