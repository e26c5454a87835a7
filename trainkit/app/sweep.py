"""Sweeps that name their winner: each job's record, the objective a sweeper gets, the summary at the end.

Every job of a ``-m`` sweep writes ``<sweep dir>/.job-<n>.json`` when it ends (its overrides, run directory,
status, error line, wall time, final metrics), from the process that ran it, so any launcher works. Hydra then
calls :class:`SweepSummary` (``hydra.callbacks.sweep_summary`` in trainkit's config) once the sweep is over; it
pairs each record with the run's ``checkpoints/best.json`` and writes ``summary.json``, ``summary.md`` and, when
matplotlib is installed, ``summary.png`` beside the jobs, best job first.

The objective returned to a sweeper (Optuna's, Nevergrad's) is the run's best ``trainer.best_metric`` -- the
value in ``best.json`` -- not its last evaluation. Optuna's direction follows ``trainer.best_mode``: the plugin's
default (``minimize``) is replaced before the sweeper starts, and a direction set against ``best_mode`` is refused
(:func:`settle_direction`); ``${trainkit_direction:}`` gives that direction in a YAML file.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger("trainkit")

JOB_RECORD = ".job-{}.json"  # hidden files beside the jobs' folders
BEST_INFO = Path("checkpoints") / "best.json"
# final metrics that describe the run rather than the model: in summary.json, left out of summary.md's table
RUN_FIGURES = ("skipped_steps", "optimizer_steps", "train_seconds", "samples_per_second", "amp_level")


def in_sweep() -> bool:
    """Whether this process runs one job of a ``-m`` sweep."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def read_best(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The run's ``best.json`` ({metric, mode, value, epoch, step, ...}), or None when it has none."""
    try:
        info = json.loads((Path(run_dir) / BEST_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info.get("value"), (int, float)) else None


def objective(run_dir: Path, fallback: float = float("nan")) -> float:
    """What a sweeper optimises: the best value of ``trainer.best_metric`` (``best.json``), else `fallback`."""
    best = read_best(run_dir)
    return float(best["value"]) if best is not None else float(fallback)


def record_job(status: str, seconds: float, error: Optional[str] = None,
               metrics: Optional[Dict[str, float]] = None, exit_status: int = 0) -> None:
    """Write this job's record for the summary; a no-op outside a sweep."""
    if not in_sweep():
        return
    hydra_cfg = HydraConfig.get()
    folder = Path(hydra_cfg.sweep.dir)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"job": int(hydra_cfg.job.num), "overrides": list(hydra_cfg.overrides.task),
              "run_dir": str(Path(hydra_cfg.runtime.output_dir).resolve()), "status": status, "error": error,
              "wall_seconds": round(seconds, 3), "final_metrics": metrics or {}, "exit_status": exit_status}
    path = folder / JOB_RECORD.format(record["job"])
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)


# ------------------------------------------------------------------- the summary
def summarize(sweep_dir: Path) -> Dict[str, Any]:
    """The sweep's jobs, best first (by each run's best value in its ``best_mode``), failed and unscored last."""
    rows: List[Dict[str, Any]] = []
    for path in sorted(Path(sweep_dir).glob(JOB_RECORD.format("*")), key=lambda p: int(p.name.split("-")[1][:-5])):
        record = json.loads(path.read_text(encoding="utf-8"))
        best = read_best(Path(record["run_dir"])) if record["status"] == "completed" else None
        record.update({"metric": best and best["metric"], "mode": best and best["mode"],
                       "best": best and best["value"], "best_epoch": best and best.get("epoch")})
        rows.append(record)
    modes = {row["mode"] for row in rows if row["mode"]}
    mode = modes.pop() if len(modes) == 1 else None  # jobs that disagree on the direction are not ranked

    def key(row: Dict[str, Any]) -> tuple:
        value = row["best"]
        if value is None or mode is None or math.isnan(value):
            return (1, row["job"], 0.0)
        return (0, -value if mode == "max" else value, row["job"])

    rows.sort(key=key)
    winner = rows[0] if rows and key(rows[0])[0] == 0 else None
    metrics = {row["metric"] for row in rows if row["metric"]}
    return {"sweep_dir": str(Path(sweep_dir).resolve()), "metric": metrics.pop() if len(metrics) == 1 else None,
            "mode": mode, "winner": winner and winner["job"], "jobs": rows,
            "failed": [row["job"] for row in rows if row["status"] != "completed"]}


def markdown(summary: Dict[str, Any]) -> str:
    """``summary.md``: the winner, then one table row per job, best first."""
    metric, mode = summary["metric"] or "best", summary["mode"] or "?"
    winner = next((row for row in summary["jobs"] if row["job"] == summary["winner"]), None)
    lines = [f"# Sweep summary: {summary['sweep_dir']}", ""]
    if winner is not None:
        lines += [f"Winner: job {winner['job']} ({' '.join(winner['overrides']) or 'no overrides'}): best "
                  f"{metric} {winner['best']:.6g} at epoch {winner['best_epoch']} ({mode}), run dir "
                  f"{winner['run_dir']}", ""]
    else:
        lines += ["No winner: no job has a best value to rank.", ""]
    lines += [f"| job | overrides | best {metric} ({mode}) | epoch | final metrics | wall s | run dir |",
              "|---|---|---|---|---|---|---|"]
    for row in summary["jobs"]:
        if row["status"] == "completed":
            best = "-" if row["best"] is None else f"{row['best']:.6g}"
            final = ", ".join(f"{k} {v:.4g}" for k, v in row["final_metrics"].items()
                              if k not in RUN_FIGURES and isinstance(v, (int, float)))
        else:
            best, final = "failed", row["error"] or row["status"]
        lines.append(f"| {row['job']} | {' '.join(row['overrides'])} | {best} | {row['best_epoch'] or '-'} | "
                     f"{final} | {row['wall_seconds']:.1f} | {row['run_dir']} |")
    return "\n".join(lines) + "\n"


def swept_values(summary: Dict[str, Any]) -> Dict[str, List[tuple]]:
    """For each override key that differs between jobs: [(value, best)] of the scored jobs."""
    by_key: Dict[str, Dict[int, str]] = {}
    for row in summary["jobs"]:
        for override in row["overrides"]:
            name, _, value = override.partition("=")
            by_key.setdefault(name.lstrip("+~"), {})[row["job"]] = value
    points: Dict[str, List[tuple]] = {}
    for name, values in by_key.items():
        pairs = [(values[row["job"]], row["best"]) for row in summary["jobs"]
                 if row["job"] in values and row["best"] is not None]
        if len({value for value, _ in pairs}) >= 2:
            points[name] = pairs
    return points


def plot(summary: Dict[str, Any], path: Path) -> bool:
    """``summary.png``: the best value against each swept key; False when matplotlib is missing or nothing varies."""
    points = swept_values(summary)
    if not points:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("sweep summary: no plot (pip install matplotlib for summary.png)")
        return False
    figure, axes = plt.subplots(1, len(points), figsize=(4 * len(points), 3.2), squeeze=False)
    for axis, (name, pairs) in zip(axes[0], points.items()):
        try:
            xs = [float(x) for x, _ in pairs]
            numeric = True
        except ValueError:
            xs, numeric = list(range(len(pairs))), False
        order = sorted(range(len(pairs)), key=lambda i: xs[i])
        axis.plot([xs[i] for i in order], [pairs[i][1] for i in order], "o-")
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 10:
            axis.set_xscale("log")
            axis.minorticks_off()
        axis.set_xticks(xs, [x for x, _ in pairs], rotation=30 if not numeric else 0)
        axis.set_xlabel(name)
        axis.set_ylabel(f"best {summary['metric'] or ''}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


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
