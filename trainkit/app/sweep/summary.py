"""The summary of a ``-m`` sweep: its runs grouped by configuration, ranked by their mean, and whether the winner is
told apart from the others by more than the spread of seeds.

A configuration is a job's overrides without ``trainer.seed`` and the keys that do not change what is trained
(``trainer.resume``, ``run_dir``, Hydra's own: :data:`NOT_TRAINED`): the runs of ``sweep.repeats=N``, or of a sweep
over ``trainer.seed``, are one configuration's repeats, also once a stopped sweep was continued. A completed job whose
``best.json`` cannot be read (edited by hand) is warned of and listed as unreadable, not counted. Each group gets
n, mean +- standard deviation (n - 1) and min-max of the best value (``best.json``), of its epoch and of the test
figure, and the mean wall time; groups are ranked by their mean best value in ``trainer.best_mode``'s direction.
The winner is *separated* when Welch's t-test (two-sided, unequal variances; scipy's
``ttest_ind_from_stats(equal_var=False)``) gives p < 0.05 against every other group with two or more runs; otherwise
the groups it cannot be told from are "within noise". A group whose runs are all equal has no spread: the other
group's decides. One run per configuration has no spread to judge by, and the summary says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from trainkit.app.sweep.records import BEST_INFO, RUN_FIGURES, read_best, read_records, unreadable_best

SEED_KEY = "trainer.seed"  # the repeat axis: runs that differ only by it are one configuration
# Keys that say how a job started or where it writes, not what it trains: a continued sweep's trainer.resume=auto
# (on the jobs it ran again, not on those it kept) must not split a configuration's repeats into two rows.
NOT_TRAINED = ("trainer.resume", "run_dir")


def trains(key: str) -> bool:
    """Whether an override's `key` can change what a job trains (not trainer.resume, run_dir, hydra's own keys)."""
    return key not in NOT_TRAINED and key.split(".", 1)[0].split("/", 1)[0] != "hydra"
ALPHA = 0.05  # Welch's t-test: p below this separates two configurations


def _key_values(overrides: Sequence[str]) -> Dict[str, str]:
    pairs = (override.partition("=") for override in overrides)
    return {name.lstrip("+~"): value for name, _, value in pairs}


def statistics(values: Sequence[Optional[float]]) -> Optional[Dict[str, Any]]:
    """{n, mean, sd, min, max} of the values that are numbers (sd: n - 1, None for one value); None for none."""
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not numbers:
        return None
    mean, sd, n = _moments(numbers)
    return {"n": n, "mean": mean, "sd": sd if n > 1 else None, "min": min(numbers), "max": max(numbers)}


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of Welch's t-test (unequal variances) that `a` and `b` have the same mean.

    Two samples without spread are told apart exactly when their means differ (p 0 or 1; scipy gives NaN there).
    "Without spread" is all values equal, compared as values: NumPy's mean of five equal values can differ from the
    value (and from the mean of three), and their variance be 1e-32; scipy then gave two identical groups p = 0.12.
    """
    from scipy import stats

    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return 0.0 if float(a[0]) != float(b[0]) else 1.0
    return float(stats.ttest_ind_from_stats(*_moments(a), *_moments(b), equal_var=False).pvalue)


def _moments(values: Sequence[float]) -> Tuple[float, float, int]:
    """(mean, sd with n - 1, n), exactly (value, 0, n) for equal values: NumPy's mean of five 0.838s is not 0.838
    and their sd 1.2e-16 (shown as a spread), and scipy's own moments of them lose all precision (and warn so)."""
    array = np.asarray(values, dtype=np.float64)
    if np.ptp(array) == 0:
        return float(array[0]), 0.0, len(array)
    return float(array.mean()), float(array.std(ddof=1)), len(array)  # more than one value: they differ


def test_figure_name(metric: Optional[str]) -> Optional[str]:
    """The final metric that holds the test set's figure of `metric`: eval/accuracy -> test_accuracy."""
    if not metric or "/" not in metric:
        return None
    prefix, name = metric.split("/", 1)
    return ("test_ema_" if prefix.endswith("ema") else "test_") + name.replace("/", "_")


def _rank_key(mode: Optional[str], value: Optional[float]) -> tuple:
    if value is None or mode is None or math.isnan(value):
        return (1, 0.0)
    return (0, -value if mode == "max" else value)


def summarize(sweep_dir: Path) -> Dict[str, Any]:
    """The sweep's jobs (best first, failed and unscored last) and its configurations (ranked by mean), with the
    verdict on the winner."""
    rows: List[Dict[str, Any]] = []
    for record in read_records(sweep_dir):
        best = read_best(Path(record["run_dir"])) if record["status"] == "completed" else None
        record.update({"metric": best and best.get("metric"), "mode": best and best.get("mode"),
                       "best": best and best["value"], "best_epoch": best and best.get("epoch"),
                       "unreadable": None if best is not None or record["status"] != "completed"
                       else unreadable_best(Path(record["run_dir"]))})
        rows.append(record)
    modes = {row["mode"] for row in rows if row["mode"]}
    mode = modes.pop() if len(modes) == 1 else None  # jobs that disagree on the direction are not ranked
    metrics = {row["metric"] for row in rows if row["metric"]}
    metric = metrics.pop() if len(metrics) == 1 else None
    rows.sort(key=lambda row: (*_rank_key(mode, row["best"]), row["job"]))
    winner = rows[0] if rows and _rank_key(mode, rows[0]["best"])[0] == 0 else None

    values = [_key_values(row["overrides"]) for row in rows]
    keys = list(dict.fromkeys(key for job in values for key in job))
    constant = {key: values[0][key] for key in keys
                if all(key in job and job[key] == values[0][key] for job in values)}
    varying = [key for key in keys if key not in constant and key != SEED_KEY and trains(key)]
    groups = _groups(rows, values, varying, mode, test_figure_name(metric))
    summary = {"sweep_dir": str(Path(sweep_dir).resolve()), "metric": metric, "mode": mode,
               "test_figure": test_figure_name(metric), "constant": constant, "varying": varying,
               "repeat_key": SEED_KEY, "winner": winner and winner["job"], "groups": groups, "jobs": rows,
               "failed": [row["job"] for row in rows if row["status"] != "completed"]}
    summary["verdict"] = verdict(groups, mode)
    return summary


def _groups(rows: List[Dict[str, Any]], values: List[Dict[str, str]], varying: List[str], mode: Optional[str],
            test_figure: Optional[str]) -> List[Dict[str, Any]]:
    by_config: Dict[tuple, List[Dict[str, Any]]] = {}
    for row, job in zip(rows, values):
        by_config.setdefault(tuple(job.get(key, "(default)") for key in varying), []).append(row)
    groups = []
    for config, members in by_config.items():
        scored = [row for row in members if row["best"] is not None and not math.isnan(row["best"])]
        groups.append({
            "config": dict(zip(varying, config)), "jobs": sorted(row["job"] for row in members),
            "n": len(scored), "runs": {str(row["job"]): row["best"] for row in scored},
            "best": statistics([row["best"] for row in scored]),
            "best_epoch": statistics([row["best_epoch"] for row in scored]),
            "test": statistics([row["final_metrics"].get(test_figure) for row in scored]) if test_figure else None,
            "wall_seconds": statistics([row["wall_seconds"] for row in members]),
            "failed": sorted(row["job"] for row in members if row["status"] != "completed")})
    groups.sort(key=lambda g: (*_rank_key(mode, g["best"] and g["best"]["mean"]), g["jobs"][0]))
    return groups


def config_name(group: Dict[str, Any]) -> str:
    """A configuration as its overrides, or "the one configuration" when nothing but the seed varies."""
    return " ".join(f"{key}={value}" for key, value in group["config"].items()) or "only the seed varies"


def verdict(groups: List[Dict[str, Any]], mode: Optional[str]) -> Dict[str, Any]:
    """Whether the best configuration is separated from the others (Welch's t-test), as a dict with its line."""
    ranked = [group for group in groups if group["n"] > 0 and mode is not None]
    if not ranked:
        return {"kind": "none", "within_noise": [], "p_values": {}, "line": "No winner: no job has a best value to "
                                                                           "rank."}
    top = ranked[0]
    if len(ranked) == 1:
        return {"kind": "single", "within_noise": [], "p_values": {},
                "line": f"One configuration ({config_name(top)}): nothing to compare; its best values spread over "
                        f"{_spread(top)}."}
    runner_up = ranked[1]
    if top["n"] < 2 or runner_up["n"] < 2:
        return {"kind": "no_spread", "within_noise": [], "p_values": {},
                "line": f"Best: {config_name(top)}. One run per configuration: there is no spread to judge by, so "
                        "this order may be the seeds' (add sweep.repeats=3 to see whether it holds)."}
    runs = [float(v) for v in top["runs"].values()]
    p_values = {}
    for index, group in enumerate(ranked[1:], start=1):
        if group["n"] >= 2:
            p_values[index] = welch_p(runs, [float(v) for v in group["runs"].values()])
    close = [index for index, group in enumerate(ranked[1:], start=1) if p_values.get(index, 1.0) >= ALPHA]
    if not close:
        return {"kind": "separated", "within_noise": [], "p_values": p_values,
                "line": f"Winner: {config_name(top)}, separated from the runner-up ({config_name(runner_up)}) by "
                        f"more than the seeds' spread: Welch's t-test p = {p_values[1]:.2g} < {ALPHA} (and against "
                        "every other configuration)."}
    shown = ", ".join(f"{config_name(ranked[i])} p = {p_values[i]:.2g}" if i in p_values else
                      f"{config_name(ranked[i])} (one run)" for i in close)
    return {"kind": "within_noise", "within_noise": [0, *close], "p_values": p_values,
            "line": f"No clear winner: the top {len(close) + 1} are within noise: pick by other criteria or add "
                    f"repeats. Best mean: {config_name(top)}; not told apart from it by Welch's t-test (p >= "
                    f"{ALPHA}): {shown}."}


def _spread(group: Dict[str, Any]) -> str:
    best = group["best"]
    return f"{best['min']:.4g}-{best['max']:.4g} over {group['n']} run(s)"


def _cell(stats: Optional[Dict[str, Any]], digits: int = 4) -> str:
    if stats is None:
        return "-"
    if stats["sd"] is None:
        return f"{stats['mean']:.{digits}g}"
    return (f"{stats['mean']:.{digits}g} ± {stats['sd']:.2g} ({stats['min']:.{digits}g}–"
            f"{stats['max']:.{digits}g})")


def markdown(summary: Dict[str, Any]) -> str:
    """``summary.md``: the verdict, the keys every job shares, one row per configuration ranked by mean, failures."""
    metric, mode = summary["metric"] or "best", summary["mode"] or "?"
    lines = [f"# Sweep summary: {summary['sweep_dir']}", "", summary["verdict"]["line"], ""]
    if summary["constant"]:
        lines += ["Same in every job: " + " ".join(f"{k}={v}" for k, v in summary["constant"].items()), ""]
    varying = summary["varying"]
    test = summary["test_figure"]
    header = [*varying, "n", f"best {metric} ({mode}): mean ± sd (min–max)", "its epoch",
              *([test] if test else []), "wall s (mean)", "jobs"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in summary["groups"]:
        cells = [*(group["config"][key] for key in varying), str(group["n"]), _cell(group["best"]),
                 _cell(group["best_epoch"], 3), *([_cell(group["test"])] if test else []),
                 _cell(group["wall_seconds"] and {**group["wall_seconds"], "sd": None}, 3),
                 ", ".join(map(str, group["jobs"]))]
        lines.append("| " + " | ".join(cells) + " |")
    unreadable = [row for row in summary["jobs"] if row.get("unreadable")]
    if unreadable:
        lines += ["", "Jobs whose result could not be read (completed, but left out of n and the ranking):"]
        lines += [f"- job {row['job']} ({' '.join(row['overrides'])}): {Path(row['run_dir']) / BEST_INFO} "
                  f"{row['unreadable']}" for row in unreadable]
    failed = [row for row in summary["jobs"] if row["status"] != "completed"]
    if failed:
        lines += ["", "Jobs that did not complete:"]
        lines += [f"- job {row['job']} ({' '.join(row['overrides'])}): {row['status']}: {row['error'] or '-'}"
                  for row in failed]
    winner = next((row for row in summary["jobs"] if row["job"] == summary["winner"]), None)
    if winner is not None:
        final = ", ".join(f"{k} {v:.4g}" for k, v in winner["final_metrics"].items()
                          if k not in RUN_FIGURES and isinstance(v, (int, float)))
        lines += ["", f"Best single run: job {winner['job']}, best {metric} {winner['best']:.6g} at epoch "
                      f"{winner['best_epoch']} ({final}), run dir {winner['run_dir']}"]
    return "\n".join(lines) + "\n"
