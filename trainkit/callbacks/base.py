"""``trainkit.Callback``: hooks with the run's state, and ``log()`` into the run's record.

A ``mindspore.train.Callback`` gets MindSpore's ``run_context``, where the optimizer is ``None`` under a
TrainingWrapper, ``optimizer.get_lr()`` indexes past the schedule at the last step, a polite stop ends the
epoch it interrupts, and ``Model.train`` alone restarts a resumed run's step count at 0 (trainkit's app sets it
to the checkpoint's step). A ``trainkit.Callback`` gets a
:class:`CallbackState` instead, with the counters the run's records use, and can record values of its own.

Hooks (named apart from MindSpore's ``on_train_*``, which this class uses to call them) and when they run (the
app runs user callbacks after its own, so an epoch's evaluation and checkpoint are done when ``on_epoch_end``
runs):

- ``on_run_start(state)``: once per process, before the first step (after a resume: at the checkpoint's step);
- ``on_step_end(state)``: after every micro-batch (only called when overridden: it costs a Python call a step);
- ``on_epoch_end(state)``: after each *complete* epoch, never for the partial epoch a polite stop (a signal, a
  stop after a step) interrupts: after ``trainer.resume=auto`` that epoch ends once, in the continuation;
- ``on_run_end(state)``: once per process, when training stops, however it stops (the last step done).

``self.log(name, value)`` inside a hook records ``name`` at the state's step in ``metrics.jsonl`` and
TensorBoard, in the same record mechanism as trainkit's own values: a continued run supersedes the records
after its checkpoint's step, yours included. Only the rank that writes the run's records records them.
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
from mindspore import Parameter, nn
from mindspore.train import Callback as MindSporeCallback

from trainkit.callbacks.order import USER_RUNS_AFTER
from trainkit.callbacks.run_log import RECORD_FIELDS, RunLog
from trainkit.callbacks.steps import GlobalStep, optimizer_learning_rate
from trainkit.callbacks.steps import stopped_mid_epoch as _stopped_mid_epoch
from trainkit.errors import TrainingError

log = logging.getLogger("trainkit")

#: Prefixes of the values trainkit records itself: a callback's ``log()`` may not use them.
RESERVED_PREFIXES = ("train/", "eval/", "eval_ema/", "test/", "test_ema/", "final/")


class LogNameError(TrainingError, ValueError):
    """``Callback.log()`` got a name it may not use: the run stops with this one line (``trainkit: error: ...``)."""


class LogValueError(TrainingError, TypeError):
    """``Callback.log()`` got a value that is not one real number: the run stops with this one line."""


@dataclass
class CallbackState:
    """What a :class:`Callback` hook sees.

    Attributes:
        step: micro-batches done in the whole run (continued across resumes): ``metrics.jsonl``'s ``step``.
        optimizer_step: accumulation windows completed, ``step // accumulation_steps``: its ``optimizer_step``.
        epoch: the epoch the step belongs to, from 1; in ``on_epoch_end``, the epoch that just ended.
        step_in_epoch: micro-batches done in that epoch (``steps_per_epoch`` at its end).
        steps_per_epoch: micro-batches in an epoch.
        accumulation_steps: micro-batches per optimizer update (``wrapper.accumulation_steps``).
        learning_rate: the rate of the update the current window makes (of the next one in ``on_run_start``),
            read from the run's schedule and clamped to its last entry: never out of range.
        network: the model being trained (the backbone, without loss or wrapper).
        wrapper: the ``TrainingWrapper`` (its ``ema``, ``optimizer``, ...).
        optimizer: the optimizer.
        run_dir: the run directory.
        rank: this process's rank (0 without data parallel).
        writer: whether this rank writes the run's records (``log()`` records nothing elsewhere).
        evaluation: the evaluation results at this step (``{"eval/accuracy": ..., ...}``) when one ran at it,
            else empty.
    """

    step: int
    optimizer_step: int
    epoch: int
    step_in_epoch: int
    steps_per_epoch: int
    accumulation_steps: int
    learning_rate: float
    network: nn.Cell
    wrapper: nn.Cell
    optimizer: Optional[nn.Optimizer]
    run_dir: Path
    rank: int
    writer: bool
    evaluation: Dict[str, float] = field(default_factory=dict)


@dataclass
class CallbackRun:
    """What the app tells its callbacks about the run (see :meth:`Callback.bind`)."""

    run_log: Optional[RunLog]
    network: nn.Cell
    wrapper: nn.Cell
    optimizer: Optional[nn.Optimizer]
    learning_rates: Sequence[float]
    run_dir: Path
    rank: int
    writer: bool
    steps_per_epoch: int
    accumulation_steps: int
    evaluation: Any = None  # the app's Evaluation callback, for the results at a step


class Callback(MindSporeCallback):
    """Base class of a training callback: override the hooks you need; call ``self.log(name, value)`` in them.

    Give it to a run like any callback, by ``_target_`` in the ``callbacks`` list (``+callbacks=[...]`` or a
    recipe). Outside trainkit's app (a plain ``Model.train``) it does nothing until :meth:`bind` is called.

    A subclass that defines ``state_dict()`` (JSON data) and ``load_state_dict(state)`` is saved in every training
    checkpoint as ``callbacks/<ClassName>`` and given its state back on resume. It runs after the epoch's
    evaluation, ``best.ckpt`` and early stopping (``run_after``), and the epoch's checkpoint after it.

    trainkit's own callbacks derive from it too, each declaring its ``order_role`` and ``run_after``
    (:mod:`trainkit.callbacks.order`); they use MindSpore's ``on_train_*`` hooks directly and are never bound, so
    the hooks above stay inert in them.
    """

    order_role = "user"
    run_after: tuple = USER_RUNS_AFTER

    _run: Optional[CallbackRun] = None

    # ------------------------------------------------------------------ the hooks to override
    def on_run_start(self, state: CallbackState) -> None:
        """Once, before the first step of this process."""

    def on_step_end(self, state: CallbackState) -> None:
        """After every micro-batch (called only when overridden)."""

    def on_epoch_end(self, state: CallbackState) -> None:
        """After each complete epoch (never for one a stop interrupted)."""

    def on_run_end(self, state: CallbackState) -> None:
        """Once, when training stops in this process."""

    # ------------------------------------------------------------------ recording
    def log(self, name: str, value: Any) -> None:
        """Record `value` (a real number; NaN and infinities are recorded as such) as `name` at the hook's step.

        Raises:
            ValueError: `name` is empty, a record's own field, or one of trainkit's (``train/...``, ``eval/...``).
            TypeError: `value` is not a real number.

        Both are a :class:`~trainkit.errors.TrainingError` too: ``python -m trainkit`` stops the run with their
        one line (``trainkit: error: MyCallback.log('x', ...): ...``, exit status 1), no traceback.
        """
        where = f"{type(self).__name__}.log({name!r}, ...)"
        if not isinstance(name, str) or not name.strip() or name in RECORD_FIELDS or name.startswith(
                RESERVED_PREFIXES):
            raise _logged(LogNameError(
                f"{where}: the name must be a non-empty string other than {', '.join(RECORD_FIELDS)} "
                f"and outside trainkit's own {', '.join(p + '*' for p in RESERVED_PREFIXES)}"))
        try:
            number = _one_real(value)
        except _OutOfRange:
            raise _logged(LogValueError(
                f"{where}: the value must be one real number within float64's range (about ±1.8e308); got "
                f"{type(value).__name__} {_short_repr(value)}")) from None
        if number is None:
            raise _logged(LogValueError(
                f"{where}: the value must be one real number; got {type(value).__name__} {_short_repr(value)}"))
        if self._pending is None:
            raise RuntimeError(f"{where} was called outside a hook: call it in on_step_end, on_epoch_end, ...")
        self._pending[name] = number

    # ------------------------------------------------------------------ wiring (the app calls bind)
    def bind(self, run: CallbackRun) -> None:
        """Connect this callback to a run; the app does it before training."""
        self._run = run
        self._global_step = GlobalStep()
        self._pending: Optional[Dict[str, float]] = None
        self._started = False
        self._wants_steps = type(self).on_step_end is not Callback.on_step_end

    _pending: Optional[Dict[str, float]] = None

    def on_train_epoch_begin(self, run_context) -> None:
        if self._run is None:
            return
        step = self._global_step(run_context.original_args())  # fixes a resumed run's offset
        if not self._started:
            self._started = True
            self._call(self.on_run_start, self._state(step, next_update=True))

    def on_train_step_end(self, run_context) -> None:
        if self._run is not None and self._wants_steps:
            self._call(self.on_step_end, self._state(self._global_step(run_context.original_args())))

    def on_train_epoch_end(self, run_context) -> None:
        if self._run is None:
            return
        step = self._global_step(run_context.original_args())
        if _stopped_mid_epoch(run_context) or step % self._run.steps_per_epoch:
            return  # a stop in the middle of an epoch, or a sink that is not an epoch's end
        self._call(self.on_epoch_end, self._state(step))

    def on_train_end(self, run_context) -> None:
        if self._run is not None and self._started:
            self._call(self.on_run_end, self._state(self._global_step(run_context.original_args())))

    def _state(self, step: int, next_update: bool = False) -> CallbackState:
        run = self._run
        assert run is not None
        window = step // run.accumulation_steps if next_update else max(step - 1, 0) // run.accumulation_steps
        rates = run.learning_rates
        evaluation = getattr(run.evaluation, "latest", None) or {}
        epoch = max(step - 1, 0) // run.steps_per_epoch + 1 if not next_update else step // run.steps_per_epoch + 1
        return CallbackState(
            step=step, optimizer_step=step // run.accumulation_steps, epoch=epoch,
            step_in_epoch=step - (epoch - 1) * run.steps_per_epoch, steps_per_epoch=run.steps_per_epoch,
            accumulation_steps=run.accumulation_steps,
            learning_rate=float(rates[min(window, len(rates) - 1)]) if len(rates)
            else optimizer_learning_rate(run.optimizer) if run.optimizer is not None else math.nan,
            network=run.network, wrapper=run.wrapper, optimizer=run.optimizer, run_dir=run.run_dir, rank=run.rank,
            writer=run.writer,
            evaluation={k: v for k, v in evaluation.items() if k not in ("step", "epoch")}
            if evaluation.get("step") == step else {})

    def _call(self, hook, state: CallbackState) -> None:
        self._pending = {}
        try:
            hook(state)
        finally:
            pending, self._pending = self._pending, None
        run = self._run
        if pending and run is not None and run.run_log is not None and run.writer:
            run.run_log.scalars(state.step, pending, epoch=state.epoch)


class _OutOfRange(ValueError):
    """One real number, finite, but beyond float64's range (``10**400``, ``Decimal('1e400')``)."""


def _one_real(value: Any) -> Optional[float]:
    """`value` as a float when it is one real number (a Python, NumPy or MindSpore one, a ``Fraction``, a
    ``Decimal``), else None. Raises :class:`_OutOfRange` for a finite one beyond float64 (``float()`` would
    overflow or round it to an infinity, which it is not); never anything else: a bad value is one line."""
    try:
        array = np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value)
        if array.size != 1 or isinstance(value, bool):
            return None
        item = array.reshape(-1)[0]  # an object array (10**400, Decimal, Fraction) holds the object itself
        item = item.item() if isinstance(item, np.generic) else item
        if isinstance(item, bool) or not isinstance(item, (numbers.Real, Decimal)):
            return None
        number = float(item)
    except OverflowError:  # an int or Fraction beyond float64
        raise _OutOfRange() from None
    except Exception:  # noqa: BLE001 - a ragged list, Decimal('sNaN'), a __float__ of the user's that raises
        return None
    if math.isinf(number) and _finite(item):
        raise _OutOfRange()  # Decimal('1e400'), np.longdouble('1e400') convert to inf without a word
    return number


def _finite(item: Any) -> bool:
    if isinstance(item, Decimal):
        return item.is_finite()
    if isinstance(item, numbers.Rational):
        return True
    try:
        return bool(np.isfinite(item))
    except TypeError:
        return False


def _short_repr(value: Any, limit: int = 60) -> str:
    """`value`'s repr cut to `limit` characters (an int of more than 4300 digits has none: Python refuses it)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<{type(value).__name__} of {value.bit_length()} bits>"
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _logged(error: TrainingError) -> TrainingError:
    """`error`, logged into train.log first (a TrainingError is logged where it is raised)."""
    log.error("%s", error)
    return error


def bind_callbacks(callbacks: Sequence[Any], run: CallbackRun) -> None:
    """Bind every :class:`Callback` among `callbacks` (the others are MindSpore's own and need nothing)."""
    for callback in callbacks:
        if isinstance(callback, Callback):
            callback.bind(run)


def learning_rate_table(optimizer: Optional[nn.Optimizer]) -> Sequence[float]:
    """The optimizer's learning rate per update (of its first group), read once: one entry for a constant rate,
    empty for a ``LearningRateSchedule`` cell (then :func:`optimizer_learning_rate` answers, clamped too)."""
    if not isinstance(optimizer, nn.Optimizer):
        return []
    rate = optimizer.learning_rate
    if optimizer.is_group_lr:
        rate = rate[0]
    if not optimizer.dynamic_lr:
        return [float(np.asarray(rate.asnumpy()).reshape(-1)[0])]
    table = getattr(rate, "learning_rate", None)  # a list of rates: MindSpore's _IteratorLearningRate holds it
    if isinstance(table, Parameter) and table.ndim == 1:
        return [float(v) for v in table.asnumpy()]
    return []
