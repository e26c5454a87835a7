"""EarlyStopping: end a run whose evaluations stopped improving, and mark it finished."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Dict, Optional

from trainkit.callbacks.base import Callback
from trainkit.callbacks.evaluation import Evaluation, check_watched
from trainkit.rundir.stateful_parts import stored_value

log = logging.getLogger("trainkit")

MARKER = "early_stopped.json"  # in the checkpoints folder: the run is finished (resume=auto does not restart it)


class EarlyStopping(Callback):
    """Stops training after `patience` evaluations in a row that did not improve `metric` by more than `min_delta`.

    Follows the results of an ``Evaluation`` callback (place it after that callback, and after ``BestCheckpoint``
    so the best checkpoint is written first). An evaluation improves when it beats the best so far by more than
    `min_delta` (``value < best - min_delta`` with ``mode="min"``, ``value > best + min_delta`` with ``"max"``; the
    first finite value always does; NaN never does). When `patience` evaluations in a row did not, the callback
    logs why, asks ``Model`` to stop (``run_context.request_stop()``: no further epoch starts) and, with a
    `marker_directory`, writes ``early_stopped.json`` there (the step, epoch, metric, best value and epoch), which
    makes the run finished for ``trainer.resume=auto``.

    Args:
        evaluation: the Evaluation callback whose results to follow.
        metric: one of ``evaluation.metric_names``, e.g. ``"eval/loss"``, ``"eval_ema/accuracy"``.
        mode: ``"min"`` (lower is better) or ``"max"``.
        patience: evaluations without improvement that stop the run (an int >= 1).
        min_delta: the least change that counts as an improvement (>= 0).
        marker_directory: where to write ``early_stopped.json`` (the run's checkpoints folder); None: nowhere.
    """

    order_role = "early_stopping"
    # best.ckpt is written before a stop
    run_after: tuple = ("start_at", "train_metrics", "progress", "nonfinite_stop", "evaluation", "best_checkpoint")

    def __init__(self, evaluation: Evaluation, metric: str, mode: str = "min", patience: int = 3,
                 min_delta: float = 0.0, marker_directory: Optional[Path] = None):
        super().__init__()
        check_watched("EarlyStopping", evaluation, metric, mode)
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStopping patience must be an int >= 1; got {patience!r}")
        if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"EarlyStopping min_delta must be a finite number >= 0; got {min_delta!r}")
        self.evaluation = evaluation
        self.metric = metric
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)
        self.marker_directory = None if marker_directory is None else Path(marker_directory)
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None
        self.bad_evaluations = 0
        self.stopped: Optional[Dict[str, Any]] = None  # the marker's content once stopped
        self._seen = len(evaluation.history)

    def on_train_begin(self, run_context) -> None:
        self._seen = len(self.evaluation.history)

    # ------------------------------------------------------------------ state (a resume continues the count)
    def state_dict(self) -> Dict[str, Any]:
        """The best value so far, its epoch and the evaluations since: what a resume must continue from."""
        return {"metric": self.metric, "mode": self.mode, "best": self.best, "best_epoch": self.best_epoch,
                "bad_evaluations": self.bad_evaluations}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of the same metric and mode; another metric or mode starts afresh."""
        state = self.checked_state(state)
        if state["metric"] != self.metric or state["mode"] != self.mode:
            log.info("early stopping follows %s (%s) now, %s (%s) in the checkpoint: its count starts afresh",
                     self.metric, self.mode, state["metric"], state["mode"])
            return
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.bad_evaluations = state["bad_evaluations"]

    @staticmethod
    def checked_state(state: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`state_dict`'s values checked as a run writes them (ValueError/KeyError naming the key)."""
        return {"metric": stored_value(state, "metric", "str"), "mode": stored_value(state, "mode", "str"),
                "best": stored_value(state, "best", "float", optional=True),
                "best_epoch": stored_value(state, "best_epoch", "int", minimum=0, optional=True),
                "bad_evaluations": stored_value(state, "bad_evaluations", "int", minimum=0)}

    def on_train_epoch_end(self, run_context) -> None:
        while self._seen < len(self.evaluation.history) and self.stopped is None:
            result = self.evaluation.history[self._seen]
            self._seen += 1
            if self.update(result):
                run_context.request_stop()

    # ------------------------------------------------------------------ the decision
    def improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, result: Dict[str, Any]) -> bool:
        """Take one evaluation result into account; returns True when the run must stop after it."""
        value = float(result[self.metric])
        if self.improves(value):
            self.best, self.best_epoch, self.bad_evaluations = value, result.get("epoch"), 0
            return False
        self.bad_evaluations += 1
        if self.bad_evaluations < self.patience:
            return False
        self.stopped = {"metric": self.metric, "mode": self.mode, "patience": self.patience,
                        "min_delta": self.min_delta, "best": self.best, "best_epoch": self.best_epoch,
                        "epoch": result.get("epoch"), "step": result.get("step")}
        best = "none" if self.best is None else f"{self.best:.6g}"
        log.info("early stopping after epoch %s: %s did not improve on its best %s (epoch %s) by more than %g in the "
                 "last %d evaluation(s) (trainer.early_stopping.patience=%d); the run is finished", result.get("epoch"),
                 self.metric, best, self.best_epoch, self.min_delta, self.bad_evaluations, self.patience)
        if self.marker_directory is not None:
            write_marker(self.marker_directory, self.stopped)
        return True


def write_marker(directory: Path, content: Dict[str, Any]) -> Path:
    """``early_stopped.json`` in `directory`, replaced atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MARKER
    temporary = directory / (MARKER + ".tmp")
    temporary.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def read_marker(directory: Path) -> Optional[Dict[str, Any]]:
    """The content of ``early_stopped.json`` in `directory`, or None."""
    try:
        return json.loads((Path(directory) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
