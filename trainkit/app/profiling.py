"""``trainer.profile``: ``mindspore.profiler`` over a window of training steps, with a summary of where time went.

Profiling a whole run is slow and its output huge; a window of a few steps after compilation is what one reads.
The callback drives ``mindspore.profiler.profile`` with a ``schedule`` (skip the steps before the window, record
``steps``) and ``tensorboard_trace_handler`` writing to ``<run dir>/profile/``. In sink mode a callback sees one
step per sink, so the window is rounded out to whole sinks. Only the ranks in ``trainer.profile.ranks`` profile.
At the end of training the per-operator CSVs are read back and the operators that took the most time are logged.
The profiler observes; the weights after a profiled run are bitwise those of an unprofiled one.
"""
from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import List, Optional, Tuple

from omegaconf import DictConfig

from trainkit.callbacks.base import Callback
from trainkit.checks import check_int
from trainkit.errors import ConfigError

log = logging.getLogger("trainkit")

PROFILE_DIR = "profile"
TRACE_FILE = "trace_view.json"


def profile_window(cfg: DictConfig, run_dir: Path, rank: int, sink_size: int) -> List[Callback]:
    """``[ProfileWindow]`` when ``trainer.profile.steps`` is set and this rank profiles, else ``[]``.

    Raises:
        ConfigError: a ``trainer.profile`` value is invalid (named, with what is valid).
    """
    settings = cfg.trainer.get("profile")
    if settings is None or not settings.steps:
        return []
    try:
        steps = check_int("trainer.profile.steps", settings.steps, 0)
        start = check_int("trainer.profile.start_step", settings.start_step, 1)
        top = check_int("trainer.profile.top_operators", settings.top_operators, 0)
        ranks = [check_int("trainer.profile.ranks[]", r, 0) for r in settings.ranks]
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if rank not in ranks:
        return []
    return [ProfileWindow(run_dir / PROFILE_DIR, start, steps, sink_size if sink_size > 0 else 1, rank, top)]


def window_in_sinks(start_step: int, steps: int, sink_size: int) -> Tuple[int, int]:
    """(first sink, number of sinks) covering steps ``start_step .. start_step + steps - 1`` (1-based)."""
    first = (start_step - 1) // sink_size
    last = math.ceil((start_step - 1 + steps) / sink_size)
    return first, last - first


class ProfileWindow(Callback):
    """Profile steps ``start_step .. start_step + steps - 1`` of this process (whole sinks in sink mode).

    Args:
        output: the folder the profiler writes into (``<run dir>/profile``).
        start_step: the first profiled step, 1-based, counted from the start of this process.
        steps: how many steps to profile.
        sink_size: steps per callback step (1 without sinking).
        rank: this process's rank, naming its output folder.
        top_operators: how many operators the end summary lists.
    """

    order_role = "profiler"
    # the last of a step: the window covers every other callback's work
    run_after: tuple = ("start_at", "train_metrics", "progress", "nonfinite_stop", "evaluation", "best_checkpoint",
                          "early_stopping", "user", "training_checkpoint", "signal_stop")

    def __init__(self, output: Path, start_step: int, steps: int, sink_size: int = 1, rank: int = 0,
                 top_operators: int = 10):
        super().__init__()
        self.output = Path(output)
        self.first, self.count = window_in_sinks(start_step, steps, sink_size)
        self.sink_size, self.rank, self.top_operators = sink_size, rank, top_operators
        if sink_size > 1 and (self.first * sink_size + 1, self.count * sink_size) != (start_step, steps):
            log.info("trainer.profile: in sink mode the window is rounded to whole sinks of %d steps: steps %d-%d",
                     sink_size, self.first * sink_size + 1, (self.first + self.count) * sink_size)
        self._profiler = None
        self._seen = 0
        self._done = False

    def on_train_begin(self, run_context) -> None:
        from mindspore.profiler import profile, schedule, tensorboard_trace_handler

        self.output.mkdir(parents=True, exist_ok=True)
        self._profiler = profile(
            start_profile=False,
            schedule=schedule(wait=0, warmup=0, active=self.count, repeat=1, skip_first=self.first),
            on_trace_ready=tensorboard_trace_handler(str(self.output), worker_name=f"rank{self.rank}"))
        self._profiler.start()

    def on_train_step_end(self, run_context) -> None:
        if self._profiler is None or self._done:
            return
        self._seen += 1
        self._profiler.step()  # the schedule records the window's steps and writes the trace when it closes
        if self._seen >= self.first + self.count:
            self._finish()

    def on_train_end(self, run_context) -> None:
        if self._profiler is not None and not self._done:
            self._finish()
        folders = sorted(self.output.glob(f"rank{self.rank}_*"))
        if not folders:
            log.warning("trainer.profile: the run ended before step %d: nothing was profiled",
                        self.first * self.sink_size + 1)
            return
        folder = folders[-1]
        trace = next(folder.rglob(TRACE_FILE), None)
        log.info("trainer.profile: steps %d-%d profiled into %s; open %s in https://ui.perfetto.dev or "
                 "chrome://tracing, or the folder in MindStudio Insight", self.first * self.sink_size + 1,
                 (self.first + self.count) * self.sink_size, folder, trace or TRACE_FILE)
        top = top_operators(folder, self.top_operators)
        if top:
            total = sum(time for _, time in top_operators(folder, None))
            log.info("trainer.profile: top operators by time: %s", ", ".join(
                f"{name} {time:.3g} ms ({100 * time / total:.1f}%)" for name, time in top))

    def _finish(self) -> None:
        self._done = True
        try:
            self._profiler.stop()
        finally:
            self._profiler = None


def top_operators(folder: Path, count: Optional[int]) -> List[Tuple[str, float]]:
    """(operator type, total ms) from the profiler's per-operator-type CSVs, most time first.

    CPU: ``FRAMEWORK/cpu_op_type_info_<rank>.csv`` (``op_type``, ``total_compute_time`` in ms); Ascend/GPU:
    ``ASCEND_PROFILER_OUTPUT/op_statistic.csv`` (``OP Type``, ``Total Time(us)``).
    """
    totals = {}
    for path in folder.rglob("cpu_op_type_info_*.csv"):
        for row in _rows(path):
            totals[row["op_type"]] = totals.get(row["op_type"], 0.0) + float(row["total_compute_time"])
    for path in folder.rglob("op_statistic*.csv"):
        for row in _rows(path):
            if "OP Type" in row and "Total Time(us)" in row:
                totals[row["OP Type"]] = totals.get(row["OP Type"], 0.0) + float(row["Total Time(us)"]) / 1000
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return ranked if count is None else ranked[:count]


def _rows(path: Path) -> List[dict]:
    with open(path, newline="", encoding="utf-8") as stream:
        return list(csv.DictReader(stream))
