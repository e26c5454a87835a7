"""Evaluation during training, with the live weights and, when there is an EMA, with the EMA weights."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
from mindspore.train import Model

from trainkit.callbacks.base import Callback
from trainkit.callbacks.run_log import RunLog
from trainkit.callbacks.steps import GlobalStep, last_epoch
from trainkit.callbacks.steps import stopped_mid_epoch as _stopped_mid_epoch
from trainkit.step.ema import ExponentialMovingAverage
from trainkit.step.in_place import assign_in_place

logger = logging.getLogger("trainkit")


@contextlib.contextmanager
def ema_weights(ema: ExponentialMovingAverage) -> Iterator[ExponentialMovingAverage]:
    """Inside the block the network's parameters hold the EMA shadow values; afterwards their own again.

    Values are copied in place (``assign_in_place``: the Parameters keep their identity and memory, so graphs
    compiled over them -- the eval network, the train step -- see the swap; on CPU a copy into that memory, not
    an operator per Parameter), and restored bit for bit from a host copy, also when the block raises. The
    shadows, the optimizer state and every other parameter are never written. Use it for evaluation or export
    with the EMA weights.
    """
    live = [p.asnumpy().copy() for p in ema.sources]
    try:
        for source, shadow in zip(ema.sources, ema.shadows):
            assign_in_place(source, shadow.asnumpy())
        yield ema
    finally:
        for source, value in zip(ema.sources, live):
            assign_in_place(source, value)


swap_in_ema = ema_weights


class Evaluation(Callback):
    """Runs ``model.eval`` at the end of every `interval`-th epoch and of the last one.

    With an `ema`, evaluates a second time with the EMA weights swapped in (see ``ema_weights``); the live
    weights are back, bit-identical, before training goes on. Each scalar metric of the Model (``metrics=``
    given to ``Model``) is recorded through `run_log` at the global step as ``eval/<name>`` and ``eval_ema/<name>``,
    e.g. ``eval/accuracy``, ``eval/loss``, ``eval_ema/accuracy``, ``eval_ema/loss``.

    ``latest`` holds the newest result and ``history`` all of them, each
    ``{"epoch": int, "step": int, "eval/accuracy": ..., ...}`` (the global step, continued across
    ``initial_epoch`` as in TrainMetrics). A run stopped early (``request_stop``) on an
    epoch that was not evaluated is evaluated at train end. ``evaluate()`` may be called directly too.

    Put it after TrainMetrics and Progress, and before BestCheckpoint, in the callback list.

    Args:
        model: the ``Model`` training the network, built with ``eval_network`` and ``metrics``.
        dataset: the evaluation dataset.
        run_log: where to record; None keeps results only in ``latest``/``history``.
        interval: evaluate every this many epochs (the last epoch always).
        ema: the train wrapper's ``ema`` (``TrainingWrapper.ema``), or None.
        dataset_sink_mode: passed to ``model.eval`` (MindSpore evaluates without sinking on CPU).
    """

    order_role = "evaluation"
    # a stop after a step is decided before the epoch's evaluation
    run_after: tuple = ("start_at", "train_metrics", "progress", "nonfinite_stop")

    def __init__(self, model: Model, dataset: Any, run_log: Optional[RunLog] = None, interval: int = 1,
                 ema: Optional[ExponentialMovingAverage] = None, dataset_sink_mode: bool = False):
        super().__init__()
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be an int >= 1; got {interval!r}")
        if ema is not None and not isinstance(ema, ExponentialMovingAverage):
            raise TypeError(f"ema must be a trainkit ExponentialMovingAverage (TrainingWrapper.ema) or None; "
                            f"got {type(ema).__name__}")
        self.model = model
        self.dataset = dataset
        self.run_log = run_log
        self.interval = interval
        self.ema = ema
        self.dataset_sink_mode = dataset_sink_mode
        self.latest: Dict[str, Any] = {}
        self.history: List[Dict[str, Any]] = []
        self._last_epoch: Optional[int] = None
        self._completed_epoch: Optional[int] = None
        self._evaluated_epoch: Optional[int] = None
        self._stopped_mid_epoch = False
        self._global_step = GlobalStep()

    @property
    def metric_names(self) -> Optional[List[str]]:
        """The tags this callback records (``eval/<metric>``, and ``eval_ema/<metric>`` with an EMA), or None
        when the Model does not expose its metrics."""
        metric_fns = getattr(self.model, "_metric_fns", None)
        if not isinstance(metric_fns, dict):
            return None
        prefixes = ["eval"] + (["eval_ema"] if self.ema is not None else [])
        return [f"{prefix}/{name}" for prefix in prefixes for name in sorted(metric_fns)]

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, run_context) -> None:
        self._last_epoch = self._completed_epoch = self._evaluated_epoch = None
        self._stopped_mid_epoch = False
        self._global_step.reset()

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        self._global_step(params)  # fixes the offset of a resumed run (initial_epoch) at its first epoch
        if self._last_epoch is None:
            self._last_epoch = last_epoch(params)

    def on_train_epoch_end(self, run_context) -> None:
        if _stopped_mid_epoch(run_context):  # a signal stopped the run after a step: the epoch did not end
            self._stopped_mid_epoch = True
            return
        params = run_context.original_args()
        epoch = int(params.cur_epoch_num)
        self._completed_epoch = epoch
        if epoch % self.interval == 0 or epoch == self._last_epoch:
            self.evaluate(epoch, self._global_step(params))

    def on_train_end(self, run_context) -> None:
        if self._stopped_mid_epoch:  # the run that continues this one evaluates as the schedule says
            return
        if self._completed_epoch is not None and self._evaluated_epoch != self._completed_epoch:
            self.evaluate(self._completed_epoch, self._global_step(run_context.original_args()))

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, epoch: Optional[int] = None, step: int = 0) -> Dict[str, Any]:
        """Evaluate now (live weights, then EMA weights); record, log and return the result."""
        start = time.perf_counter()
        result: Dict[str, Any] = {"epoch": epoch, "step": int(step)}
        result.update(_prefixed("eval", self.model.eval(self.dataset, dataset_sink_mode=self.dataset_sink_mode)))
        if self.ema is not None:
            with ema_weights(self.ema):
                ema_result = self.model.eval(self.dataset, dataset_sink_mode=self.dataset_sink_mode)
            result.update(_prefixed("eval_ema", ema_result))
        seconds = time.perf_counter() - start
        if self.run_log is not None:
            self.run_log.scalars(step, {k: v for k, v in result.items() if k not in ("epoch", "step")}, epoch=epoch)
        self.latest = result
        self.history.append(result)
        self._evaluated_epoch = epoch
        logger.info("epoch %s evaluation (%.1f s): %s", epoch, seconds,
                    ", ".join(f"{k} {v:.4f}" for k, v in result.items() if k not in ("epoch", "step")))
        return result


def check_watched(watcher: str, evaluation: Evaluation, metric: str, mode: str) -> None:
    """Raise ValueError, naming `watcher` (the callback's name), unless `mode` is "max" or "min" and `metric` is
    one `evaluation` records."""
    if mode not in ("max", "min"):
        raise ValueError(f"{watcher} mode must be 'max' or 'min'; got {mode!r}")
    valid = evaluation.metric_names
    if valid is not None and metric not in valid:
        raise ValueError(f"{watcher} metric {metric!r} is not recorded by the Evaluation callback; "
                         f"valid metrics: {', '.join(valid)}")




def _prefixed(prefix: str, metrics: Dict[str, Any]) -> Dict[str, float]:
    """Scalar metrics as ``{"<prefix>/<name>": float}``; a metric with several values (e.g. a confusion matrix)
    is left out with a warning."""
    result = {}
    for name, value in metrics.items():
        array = np.asarray(value)
        if array.size != 1:
            logger.warning("evaluation metric %r has %d values; only scalar metrics are recorded", name, array.size)
            continue
        result[f"{prefix}/{name}"] = float(array.reshape(-1)[0])
    return result


def eval_tag(metric: str) -> str:
    """``ema_accuracy`` -> ``eval_ema/accuracy``, ``loss`` -> ``eval/loss``."""
    return f"eval_ema/{metric[4:]}" if metric.startswith("ema_") else f"eval/{metric}"


def metric_name(tag: str) -> str:
    """The inverse of :func:`eval_tag`."""
    group, name = tag.split("/", 1)
    return f"ema_{name}" if group == "eval_ema" else name
