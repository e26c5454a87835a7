"""What each job of a ``-m`` sweep leaves for the summary: its record beside the jobs and its run's ``best.json``.

Every job writes ``<sweep dir>/.job-<n>.json`` when it ends (its overrides, run directory, status, error line, wall
time, final metrics), from the process that ran it, so any launcher works. The objective returned to a sweeper
(Optuna's, Nevergrad's) is the run's best ``trainer.best_metric`` -- the value in ``best.json`` -- not its last
evaluation.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

JOB_RECORD = ".job-{}.json"  # hidden files beside the jobs' folders
BEST_INFO = Path("checkpoints") / "best.json"
LAUNCHER = "hydra_plugins.trainkit_launcher.TrainkitLauncher"  # hydra/launcher=trainkit: sweep.repeats needs it
# final metrics that describe the run rather than the model: in summary.json, left out of summary.md
RUN_FIGURES = ("skipped_steps", "optimizer_steps", "train_seconds", "samples_per_second", "amp_level")


def in_sweep() -> bool:
    """Whether this process runs one job of a ``-m`` sweep."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def read_best(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The run's ``best.json`` ({metric, mode, value, epoch, step, ...}), or None when it has none or it cannot be
    read; a file that is there but unreadable (edited by hand, cut short) is said once, in one line on stderr."""
    path = Path(run_dir) / BEST_INFO
    info, problem = _best_info(path)
    if problem is not None and str(path) not in _warned:
        _warned.add(str(path))
        print(f"trainkit: warning: {path} {problem}: that run's best value is left out (the summary counts it as "
              "unreadable, not as a result)", file=sys.stderr)
    return info


def unreadable_best(run_dir: Path) -> Optional[str]:
    """Why the run's ``best.json`` is there but cannot be read as one trainkit wrote, or None (read, or absent)."""
    return _best_info(Path(run_dir) / BEST_INFO)[1]


_warned: set = set()  # the files read_best has warned of: once per process (objective and summary both read)


def _best_info(path: Path) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(best.json's content, None), (None, None) when there is no file, or (None, why it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as error:
        return None, f"could not be read ({type(error).__name__}: {error})"
    try:
        info = json.loads(text)
    except ValueError as error:
        return None, f"is not JSON ({error})"
    if not isinstance(info, dict):
        return None, f"holds a JSON {type(info).__name__}, not the object trainkit writes"
    value = info.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"has no number under \"value\" ({json.dumps(value)})"
    return info, None


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


def read_record(sweep_dir: Path, job: int) -> Optional[Dict[str, Any]]:
    """Job `job`'s record, or None when it has none (it never ran, or it was killed before it could write one)."""
    try:
        record = json.loads((Path(sweep_dir) / JOB_RECORD.format(job)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "status" in record else None


def read_records(sweep_dir: Path) -> List[Dict[str, Any]]:
    """Every job's record in `sweep_dir`, in job order."""
    numbers = sorted(int(p.name[5:-5]) for p in Path(sweep_dir).glob(JOB_RECORD.format("*"))
                     if p.name[5:-5].isdigit())
    return [record for record in (read_record(sweep_dir, n) for n in numbers) if record is not None]
