"""Sweeps that name their winner: each job's record, the objective a sweeper gets, the summary at the end.

Each job's record and objective are in :mod:`trainkit.app.sweep.records`; Hydra calls :class:`SweepSummary`
(``hydra.callbacks.sweep_summary`` in trainkit's config) once the sweep is over, which writes ``summary.json``,
``summary.md`` (:mod:`trainkit.app.sweep.summary`: runs grouped by configuration, ranked by mean, the winner's
separation) and, when matplotlib is installed, ``summary.png`` (:mod:`trainkit.app.sweep.plot`) beside the jobs.
``sweep.repeats`` is done by trainkit's launcher (:mod:`trainkit.app.sweep.launcher`).

Optuna's direction follows ``trainer.best_mode``: the plugin's default (``minimize``) is replaced before the sweeper
starts, and a direction set against ``best_mode`` is refused (:func:`settle_direction`); ``${trainkit_direction:}``
gives that direction in a YAML file.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from trainkit.app.sweep.plot import plot
from trainkit.app.sweep.records import BEST_INFO, JOB_RECORD, RUN_FIGURES, in_sweep, objective, read_best, record_job
from trainkit.app.sweep.summary import markdown, summarize

__all__ = ["BEST_INFO", "JOB_RECORD", "RUN_FIGURES", "SweepSummary", "direction", "in_sweep", "markdown", "objective",
           "plot", "read_best", "record_job", "register_resolver", "settle_direction", "summarize", "write_summary"]
log = logging.getLogger("trainkit")


def write_summary(sweep_dir: Path) -> Dict[str, Any]:
    """Write ``summary.json``, ``summary.md`` (and ``summary.png``) into `sweep_dir`; returns the summary."""
    sweep_dir = Path(sweep_dir)
    summary = summarize(sweep_dir)
    for name, text in (("summary.json", json.dumps(summary, indent=2) + "\n"), ("summary.md", markdown(summary))):
        temporary = sweep_dir / (name + ".tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, sweep_dir / name)
    try:
        plot(summary, sweep_dir / "summary.png")
    except (ValueError, TypeError, OSError, RuntimeError) as error:  # a picture is not worth a failed sweep
        log.warning("sweep summary: no plot (%s: %s)", type(error).__name__, error)
    return summary


class SweepSummary(Callback):
    """Hydra callback: at the end of a ``-m`` sweep, write and print the summary; a sweep with a failed job ends
    with the status of its first failure (2: bad input, 1: a run that could not go on). Before the sweeper starts,
    it settles Optuna's direction (:func:`settle_direction`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problem = settle_direction(config)
        if problem:
            print(f"trainkit: error: {problem}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not any(sweep_dir.glob(JOB_RECORD.format("*"))):
            return
        summary = write_summary(sweep_dir)
        print("\n" + markdown(summary), end="")
        if summary["failed"]:
            rows = {row["job"]: row for row in summary["jobs"]}
            first = rows[min(summary["failed"])]
            print(f"trainkit: error: {len(summary['failed'])} of {len(rows)} jobs failed (job "
                  f"{', '.join(map(str, sorted(summary['failed'])))}); each error line is in "
                  f"{(sweep_dir / 'summary.md').resolve()}", file=sys.stderr)
            sys.exit(first.get("exit_status") or 1)


def direction(*, _root_: DictConfig) -> str:
    """``${trainkit_direction:}``: ``maximize`` or ``minimize``, as ``trainer.best_mode`` ranks the best metric."""
    from trainkit.app.config import best_metric, best_mode

    return "maximize" if best_mode(best_metric(_root_), _root_.trainer.best_mode) == "max" else "minimize"


def settle_direction(config: DictConfig) -> Optional[str]:
    """Make a sweeper's ``direction`` follow ``trainer.best_mode``; the reason to refuse the sweep, or None.

    Optuna's plugin gives ``Direction.minimize`` (an Enum) when nobody set a direction; a YAML file or the command
    line gives a string (or ``${trainkit_direction:}``). The Enum default is replaced by the direction of
    ``trainer.best_mode``; a direction that was set must agree with it, since trainkit ranks the runs by best_mode.
    """
    sweeper = config.hydra.sweeper
    if "direction" not in sweeper:
        return None
    wanted = direction(_root_=config)
    node = sweeper._get_node("direction")
    if not node._is_interpolation() and isinstance(node._value(), Enum):  # the plugin's own default
        with read_write(sweeper), open_dict(sweeper):
            sweeper.direction = wanted
        return None
    given = sweeper.direction
    given = list(given) if OmegaConf.is_list(given) else [given]
    names = [getattr(value, "name", value) for value in given]
    if names == [wanted]:
        return None
    from trainkit.app.config import best_metric, best_mode

    metric = best_metric(config)
    mode = best_mode(metric, config.trainer.best_mode)
    shown = names[0] if len(names) == 1 else names
    return (f"hydra.sweeper.direction={shown} optimises against trainer.best_mode, which ranks {metric} by {mode} "
            f"(the sweep's winner, best.json and the sweeper's objective are all ranked that way): leave "
            f"hydra.sweeper.direction out (it follows trainer.best_mode: {wanted}) or set trainer.best_mode")


def register_resolver() -> None:
    if not OmegaConf.has_resolver("trainkit_direction"):
        OmegaConf.register_new_resolver("trainkit_direction", direction)
