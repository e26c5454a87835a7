"""The command line that made a run, Hydra's record of it, and the command that continues it.

The launcher repeats a command on every worker and a stopped run prints the command that continues it: both
rebuild it from Hydra's own config of the run (``hydra_config_of``), never from a guess.
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

_CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
_entry_point: List[str] = ["python", "-m", "trainkit"]  # the command a user types; a project's (trainkit.project.main)
_implied: List[str] = []  # what that command adds by itself, left out of the command it is told to type


def set_entry_point(words: Sequence[str], implied: Sequence[str] = ()) -> None:
    """The command this process runs as (``python -m myproject``) and the arguments it adds by itself."""
    _entry_point[:] = list(words)
    _implied[:] = list(implied)


def hydra_config_of(run_dir: Path) -> Optional[DictConfig]:
    """Hydra's own config when Hydra runs this run; None in-process (``compose_config``).

    ``HydraConfig`` is process-global and outlives a Hydra run: after ``python -m trainkit`` ran in this process
    (tests, notebooks), a later ``train(compose_config(...))`` would otherwise read that run's choices.
    """
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None, throw_on_missing=False)
    return hydra_cfg if output_dir is not None and Path(output_dir).resolve() == run_dir else None


def command_flags(argv: Sequence[str]) -> List[str]:
    """Hydra's --config-path/--config-name/--config-dir flags of this command, for the workers' command."""
    flags = []
    for index, argument in enumerate(argv):
        name = argument.split("=", 1)[0]
        if name in _CONFIG_FLAGS:
            flags.append(argument)
            if "=" not in argument and index + 1 < len(argv):
                flags.append(argv[index + 1])
    return flags


def forwarded_hydra_overrides(overrides: Sequence[str]) -> List[str]:
    """The user's ``hydra.*`` overrides (``hydra.searchpath``, logging...), without those that place this run."""
    placed = ("hydra.run.", "hydra.sweep.", "hydra.mode", "hydra.job.num", "hydra.job.id", "hydra.runtime.")
    return [o for o in overrides if not o.lstrip("+~").startswith(placed)]


def hydra_quoted(value: str) -> str:
    """A value as Hydra's override grammar reads it back unchanged."""
    if re.fullmatch(r"[\w./\-:+@~]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def continue_command(run_dir: Path) -> str:
    """The command that continues this run: this command's overrides, its run directory and ``trainer.resume=auto``.

    Outside ``python -m trainkit`` (``train(cfg)`` in-process) there is no command line to repeat: the answer says
    what to change in the config instead.
    """
    hydra_cfg = hydra_config_of(Path(run_dir))  # None in-process, also after a Hydra run in this process
    if hydra_cfg is None:
        return f"train(cfg) again with trainer.resume=auto and run_dir={run_dir}"
    task = [o for o in hydra_cfg.overrides.task if not o.lstrip("+~").startswith("trainer.resume=")]
    given = [*command_flags(sys.argv[1:]), *task, *forwarded_hydra_overrides(hydra_cfg.overrides.hydra)]
    words = [*_entry_point, *(word for word in given if word not in _implied), f"hydra.run.dir={run_dir}",
             "trainer.resume=auto"]
    return " ".join(shlex.quote(word) for word in words)


def sweep_continue_command(sweep_dir: Path, task: Sequence[str], hydra_overrides: Sequence[str]) -> str:
    """The ``-m`` command that continues a stopped sweep in `sweep_dir`: this command's overrides (sweeps included),
    its sweep directory and ``trainer.resume=auto``, which skips the jobs that completed."""
    given = [*command_flags(sys.argv[1:]), *(o for o in task if not o.lstrip("+~").startswith("trainer.resume=")),
             *forwarded_hydra_overrides(hydra_overrides)]
    words = [*_entry_point, "-m", *(word for word in given if word not in _implied), f"hydra.sweep.dir={sweep_dir}",
             "trainer.resume=auto"]
    return " ".join(shlex.quote(word) for word in words)
