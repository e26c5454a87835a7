"""``summary.png`` of a sweep: every run's best value as a point and each configuration's mean, against each swept
key (one panel per key), so the spread of seeds is seen beside the differences between configurations."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List

log = logging.getLogger("trainkit")


def _positions(labels: List[str]) -> tuple:
    """x of each distinct value: the number when every value is one, else its rank; and whether numeric."""
    distinct = list(dict.fromkeys(labels))
    try:
        numbers = {label: float(label) for label in distinct}
        return numbers, True
    except ValueError:
        return {label: float(i) for i, label in enumerate(distinct)}, False


def plot(summary: Dict[str, Any], path: Path) -> bool:
    """Write `path`; False when matplotlib is missing or no run has a best value."""
    groups = [group for group in summary["groups"] if group["n"] > 0]
    if not groups:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("sweep summary: no plot (pip install matplotlib for summary.png)")
        return False
    keys = summary["varying"] or [None]
    figure, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
    for axis, key in zip(axes[0], keys):
        labels = [group["config"][key] if key else "all" for group in groups]
        x_of, numeric = _positions(labels)
        wide = numeric and min(x_of.values()) > 0 and max(x_of.values()) / min(x_of.values()) >= 10
        span = (max(x_of.values()) - min(x_of.values())) or 1.0
        for group, label in zip(groups, labels):
            x = x_of[label]
            runs = list(group["runs"].values())
            # runs of one configuration side by side around its x (multiplied on a log axis)
            offsets = [(i - (len(runs) - 1) / 2) * 0.04 for i in range(len(runs))]
            xs = [x * 10 ** o if wide else x + o * span * 0.5 for o in offsets]
            axis.plot(xs, runs, "o", color="tab:blue", alpha=0.6, markersize=5,
                      label="one run" if group is groups[0] else None)
            axis.plot([x], [group["best"]["mean"]], "_", color="black", markersize=22, markeredgewidth=2,
                      label="mean" if group is groups[0] else None)
        if wide:
            axis.set_xscale("log")
            axis.minorticks_off()
        axis.set_xticks(list(x_of.values()), list(x_of), rotation=0 if numeric else 30)
        axis.set_xlabel(key or "(only the seed varies)")
        axis.set_ylabel(f"best {summary['metric'] or ''}")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True
