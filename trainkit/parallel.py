"""The parallel context: ``mindspore.communication.init`` and ``set_auto_parallel_context`` from config."""
from __future__ import annotations

import os
from typing import Tuple

import mindspore as ms

from trainkit.errors import ConfigError

_PARALLEL_MODES = {
    "data_parallel": ms.ParallelMode.DATA_PARALLEL,
    "semi_auto_parallel": ms.ParallelMode.SEMI_AUTO_PARALLEL,
    "auto_parallel": ms.ParallelMode.AUTO_PARALLEL,
    "hybrid_parallel": ms.ParallelMode.HYBRID_PARALLEL,
}


def launched_by_msrun() -> bool:
    """Whether this process is a worker of a MindSpore dynamic cluster (msrun sets MS_ROLE)."""
    return bool(os.environ.get("MS_ROLE"))


def setup_parallel(mode: str, gradients_mean: bool = True) -> Tuple[int, int]:
    """Initialise communication once and set the auto-parallel context; returns ``(rank, group_size)``.

    ``stand_alone`` touches nothing and returns ``(0, 1)``.

    Raises:
        ConfigError: an unknown mode, or a parallel mode outside a distributed launch.
    """
    if mode == "stand_alone":
        return 0, 1
    if mode not in _PARALLEL_MODES:
        raise ConfigError(f"parallel.mode={mode!r} is not valid: use stand_alone or one of "
                          f"{', '.join(_PARALLEL_MODES)}")
    if mode in ("semi_auto_parallel", "auto_parallel") and ms.get_context("device_target") == "CPU":
        raise ConfigError(f"parallel.mode={mode} runs on Ascend and GPU only (MindSpore's operator sharding); "
                          "on CPU use parallel=data_parallel or hybrid_parallel")
    if not launched_by_msrun():
        raise ConfigError(f"parallel.mode={mode} needs one process per device started by msrun, e.g. "
                          f"msrun --worker_num=2 --local_worker_num=2 -- python -m trainkit parallel={mode} ...; "
                          "or use parallel=stand_alone")
    from mindspore.communication import get_group_size, get_rank, init

    init()
    group_size = get_group_size()
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode=_PARALLEL_MODES[mode], gradients_mean=gradients_mean,
                                 device_num=group_size)
    return get_rank(), group_size
