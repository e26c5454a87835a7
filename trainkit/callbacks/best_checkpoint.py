"""BestCheckpoint: keep the checkpoint of the best evaluation so far, replaced atomically."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
from mindspore import nn

from trainkit.callbacks.base import Callback
from trainkit.callbacks.evaluation import Evaluation, check_watched
from trainkit.errors import DataError
from trainkit.rundir.checkpoint_file import checkpoint_crc, load_checkpoint_file, nothing_partial_left, save_checksummed
from trainkit.rundir.stateful_parts import stored_value

logger = logging.getLogger("trainkit")

#: What ``best.ckpt`` carries, appended, about itself: the metric, value (float32) and step it was saved for.
BEST_ENTRIES = ("best_metric", "best_value", "best_step")


class BestCheckpoint(Callback):
    """Saves the train network to ``<directory>/best.ckpt`` whenever `metric` improves.

    Reads each new result of an ``Evaluation`` callback (so it must come after that callback in the list;
    ``on_train_begin`` raises ValueError otherwise) and, when ``result[metric]`` beats the best so far
    (strictly; NaN never does), saves `network` -- by default the Model's train network, i.e. the
    TrainingWrapper, so the optimizer state, loss scale and EMA shadows are in the file too. The file
    is written as ``best.tmp.ckpt`` in the same directory (``mindspore.save_checkpoint`` insists on a
    ``.ckpt`` suffix) and moved over ``best.ckpt`` with ``os.replace``, so a crash leaves the previous best
    intact. ``best.json`` (``{"metric", "mode", "value", "epoch", "step", "checkpoint", "crc32"}``) is replaced the
    same way after it. The file carries its CRC32 (checked whenever trainkit loads it) and, appended, the metric,
    value and step it was saved for (:data:`BEST_ENTRIES`); ``best.json``'s ``crc32`` is that file's, so the two
    are tied: a ``best.json`` left by a crash between the two replacements, or edited, does not match.

    An existing ``best.json`` for the same metric and mode, next to the checkpoint it describes, sets the best so
    far, so a resumed run does not overwrite a better checkpoint with a worse one. When it does not describe
    ``best.ckpt`` (another CRC32), the best so far is read from ``best.ckpt`` itself, with a warning; when
    ``best.ckpt`` is corrupt, there is no best so far and the next evaluation replaces it.

    Its state (:meth:`state_dict`: the metric, mode, best value, its epoch and step) is a stateful part of the run
    (``best_checkpoint``): every training checkpoint holds it, and a resume gives it back, so the continuation
    compares with the best the checkpoint's run had at that step, as the uninterrupted run does. It is taken back
    only when ``best.ckpt`` is in `directory` (a resume into a new run directory starts ``best.ckpt`` anew there).

    After training, ``holds_last_state`` says whether this process saved ``best.ckpt`` at the run's last call, so
    that the network holds its weights now (the test-set evaluation then reads them from memory, not the file).

    Args:
        evaluation: the Evaluation callback whose results to follow.
        directory: where ``best.ckpt`` and ``best.json`` go (created if missing).
        metric: one of ``evaluation.metric_names``, e.g. ``"eval/accuracy"``, ``"eval_ema/loss"``.
        mode: ``"max"`` (higher is better) or ``"min"``.
        network: the Cell to save; default the train network of the run.
        metadata: more entries the file gets (the data's class names,
            :func:`trainkit.rundir.class_names.checkpoint_entries`).

    Raises:
        ValueError: `metric` is not recorded by `evaluation` (the message lists the valid names), or
            `mode` is not "max"/"min".
    """

    order_role = "best_checkpoint"
    # reads the evaluation it follows
    run_after: tuple = ("start_at", "train_metrics", "progress", "nonfinite_stop", "evaluation")

    checkpoint_name = "best.ckpt"
    temporary_name = "best.tmp.ckpt"
    info_name = "best.json"

    def __init__(self, evaluation: Evaluation, directory: Union[str, Path], metric: str = "eval/accuracy",
                 mode: str = "max", network: Optional[nn.Cell] = None,
                 metadata: Optional[Dict[str, str]] = None):
        super().__init__()
        check_watched("BestCheckpoint", evaluation, metric, mode)
        self.evaluation = evaluation
        self.directory = Path(directory)
        self.metric = metric
        self.mode = mode
        self.network = network
        self.metadata = dict(metadata or {})
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None
        self.best_step: Optional[int] = None
        self.saves = 0
        self._saved_at: Optional[int] = None  # the call (cur_step_num) this process last saved at
        self.holds_last_state = False
        self._seen = len(evaluation.history)
        self._load_previous_best()

    @property
    def path(self) -> Path:
        return self.directory / self.checkpoint_name

    # ------------------------------------------------------------------ state (a resume continues from it)
    def state_dict(self) -> Dict[str, Any]:
        """The best so far (value, epoch, step) of this metric and mode: what a resume continues from."""
        return {"metric": self.metric, "mode": self.mode, "best": self.best, "best_epoch": self.best_epoch,
                "best_step": self.best_step}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`. Another metric or mode (``trainer.best_metric`` changed), or no
        ``best.ckpt`` in the directory, keeps what the directory says (``best.json``; nothing: the next evaluation
        writes ``best.ckpt``)."""
        state = self.checked_state(state)
        if state["metric"] != self.metric or state["mode"] != self.mode:
            logger.info("best.ckpt follows %s (%s) now, %s (%s) in the checkpoint: the best so far is best.json's",
                        self.metric, self.mode, state["metric"], state["mode"])
            return
        if not self.path.is_file():
            if state["best"] is not None:
                logger.info("%s is not there: the next evaluation writes it (the checkpoint's best so far, %.6g, "
                            "is not taken)", self.path, state["best"])
            return
        self.best, self.best_epoch, self.best_step = state["best"], state["best_epoch"], state["best_step"]

    @staticmethod
    def checked_state(state: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`state_dict`'s values checked as a run writes them (ValueError/KeyError naming the key)."""
        mode = stored_value(state, "mode", "str")
        if mode not in ("max", "min"):
            raise ValueError(f"mode is {mode!r}, not 'max' or 'min'")
        return {"metric": stored_value(state, "metric", "str"), "mode": mode,
                "best": stored_value(state, "best", "float", optional=True),
                "best_epoch": stored_value(state, "best_epoch", "int", minimum=0, optional=True),
                "best_step": stored_value(state, "best_step", "int", minimum=0, optional=True)}

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, run_context) -> None:
        callbacks = list(run_context.original_args().get("list_callback") or [])
        if self in callbacks and self.evaluation in callbacks and \
                callbacks.index(self) < callbacks.index(self.evaluation):
            raise ValueError("BestCheckpoint must come after its Evaluation callback in the callback list")
        self._seen = len(self.evaluation.history)

    def on_train_epoch_end(self, run_context) -> None:
        self._follow(run_context)

    def on_train_end(self, run_context) -> None:
        self._follow(run_context)
        # Whether best.ckpt is what the network holds now: saved by this process, with no call after it.
        step = run_context.original_args().get("cur_step_num")
        self.holds_last_state = self._saved_at is not None and self._saved_at == step

    def _follow(self, run_context) -> None:
        network = self.network if self.network is not None else run_context.original_args().get("train_network")
        while self._seen < len(self.evaluation.history):
            if self.update(self.evaluation.history[self._seen], network):
                self._saved_at = run_context.original_args().get("cur_step_num")
            self._seen += 1

    # ------------------------------------------------------------------ the decision
    def is_improvement(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best

    def update(self, result: Dict[str, Any], network: nn.Cell) -> bool:
        """Save `network` if ``result[metric]`` improves on the best so far; returns whether it saved."""
        if self.metric not in result:
            valid = sorted(k for k in result if k not in ("epoch", "step"))
            raise ValueError(f"BestCheckpoint metric {self.metric!r} is not in the evaluation result; "
                             f"valid metrics: {', '.join(valid)}")
        value = float(result[self.metric])
        if not self.is_improvement(value):
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / self.temporary_name
        intact = f"{self.path.name} holds the previous best, intact" if self.path.is_file() else "no best.ckpt was left"
        with nothing_partial_left(temporary, intact, named=self.path):
            save_checksummed(network, temporary, {**self.metadata, "best_metric": self.metric, "best_value": value,
                                                  "best_step": int(result.get("step") or 0)})
        os.replace(temporary, self.path)
        info = {"metric": self.metric, "mode": self.mode, "value": value, "epoch": result.get("epoch"),
                "step": result.get("step"), "checkpoint": self.checkpoint_name, "crc32": checkpoint_crc(self.path)}
        info_temporary = self.directory / (self.info_name + ".tmp")
        info_temporary.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        os.replace(info_temporary, self.directory / self.info_name)
        previous = self.best
        self.best, self.best_epoch, self.best_step = value, result.get("epoch"), result.get("step")
        self.saves += 1
        logger.info("best %s %.6g (was %s) at epoch %s: saved %s", self.metric, value,
                    "none" if previous is None else f"{previous:.6g}", self.best_epoch, self.path)
        return True

    def _load_previous_best(self) -> None:
        info_path = self.directory / self.info_name
        if not (info_path.is_file() and self.path.is_file()):
            return
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if info.get("crc32") != checkpoint_crc(self.path):
            info = self._info_from_checkpoint(info_path)
        else:
            info = self._checked_against_checkpoint(info, info_path)
        if info.get("metric") == self.metric and info.get("mode") == self.mode and \
                isinstance(info.get("value"), (int, float)):
            self.best = float(info["value"])
            self.best_epoch, self.best_step = _count(info.get("epoch")), _count(info.get("step"))

    def _checked_against_checkpoint(self, info: Dict[str, Any], info_path: Path) -> Dict[str, Any]:
        """`info` when ``best.ckpt``'s own entries (metric, value as float32, step) agree with it; else those
        entries, with a warning: the CRC32 ties best.json to the file, not its value, which an edit can change
        (a higher value kept, and no later evaluation would ever replace best.ckpt, silently)."""
        try:
            own = load_checkpoint_file(self.path)
        except DataError:
            return self._info_from_checkpoint(info_path)  # says why it cannot be read
        if "best_value" not in own:
            return info  # written before checkpoints said their value: the CRC32 is all there is to check
        value, step = float(own["best_value"].asnumpy()), int(own["best_step"].asnumpy())
        claimed = info.get("value")
        agree = (isinstance(claimed, (int, float)) and not isinstance(claimed, bool)
                 and np.float32(claimed) == np.float32(value) and info.get("metric") == str(own.get("best_metric"))
                 and info.get("step") == step)
        if agree:
            return info
        logger.warning("%s says %s %s at step %s, but %s was saved for %s %.6g at step %d (best.json edited?): the "
                       "best so far is %s's own", info_path, info.get("metric"), claimed, info.get("step"),
                       self.path, own.get("best_metric"), value, step, self.path.name)
        return {"metric": str(own.get("best_metric")), "mode": self.mode, "value": value, "epoch": None}

    def _info_from_checkpoint(self, info_path: Path) -> Dict[str, Any]:
        """What ``best.ckpt`` says it was saved for, when ``best.json`` does not describe it."""
        try:
            saved = load_checkpoint_file(self.path)
        except DataError as error:
            logger.warning("%s does not describe %s and %s: the best so far is unknown, the next evaluation "
                           "replaces it", info_path, self.path, error)
            return {}
        if "best_value" not in saved:
            logger.warning("%s does not describe %s (another CRC32), which does not say its value: the best so far "
                           "is unknown, the next evaluation replaces it", info_path, self.path)
            return {}
        value = float(saved["best_value"].asnumpy())
        logger.warning("%s does not describe %s (another CRC32): the best so far is %s's own, %.6g at step %d",
                       info_path, self.path, self.path.name, value, int(saved["best_step"].asnumpy()))
        return {"metric": str(saved.get("best_metric")), "mode": self.mode, "value": value, "epoch": None}


def _count(value: Any) -> Optional[int]:
    """`value` when it is a count (an int >= 0, not a bool), else None: best.json is a file someone may edit."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
