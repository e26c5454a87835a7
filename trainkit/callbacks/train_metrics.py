"""TrainMetrics: the training curves (loss, learning rate, loss scale, gradient norm, skipped steps, throughput)."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, NamedTuple, Optional

import numpy as np
from mindspore import Parameter, Tensor, nn

from trainkit.callbacks.base import Callback
from trainkit.callbacks.run_log import RunLog
from trainkit.callbacks.steps import (  # noqa: F401 - their names here too, as before
    GlobalStep,
    _scalar,
    find_optimizer,
    last_epoch,
    optimizer_learning_rate,
    stopped_mid_epoch,
)
from trainkit.rundir.stateful_parts import stored_value
from trainkit.rundir.weights import numpy_dtype
from trainkit.step.in_place import assign_in_place


class StepOutputs(NamedTuple):
    """One train-network call's outputs as Python numbers; None where the network does not report it."""

    loss: float
    overflow: Optional[bool]
    loss_scale: Optional[float]
    grad_norm: Optional[float]


def step_outputs(outputs: Any) -> StepOutputs:
    """Read a train network's outputs: TrainingWrapper's ``(loss, overflow, loss_scale, grad_norm)``,
    MindSpore's ``TrainOneStepWithLossScaleCell`` ``(loss, overflow, loss_scale)``, or a bare loss Tensor."""
    if not isinstance(outputs, (tuple, list)):
        return StepOutputs(_scalar(outputs), None, None, None)
    values = list(outputs) + [None] * (4 - len(outputs))
    loss, overflow, scale, grad_norm = values[:4]
    return StepOutputs(_scalar(loss),
                       None if overflow is None else bool(_scalar(overflow)),
                       None if scale is None else _scalar(scale),
                       None if grad_norm is None else _scalar(grad_norm))


def _set_zero(parameter: Parameter) -> None:
    """Zero `parameter` in the memory compiled graphs read (``assign_in_place``: 10-20 us where ``set_data`` of a
    new Tensor cost 160 us a record, and gives the Parameter new memory)."""
    assign_in_place(parameter, np.zeros(parameter.shape, numpy_dtype(parameter.dtype)))


class TrainMetrics(Callback):
    """Records the training curves through a RunLog every `log_every_n_steps` steps and at each epoch end.

    Tags (each at the global step: ``cur_step_num``, continued across ``initial_epoch``, see ``GlobalStep``):

    * ``train/loss``: mean of the losses this callback saw since the previous record;
    * ``train/learning_rate``: from `learning_rate()` if given, else the optimizer's (see
      ``optimizer_learning_rate``); left out when neither is available;
    * ``train/loss_scale``: the last step's scale (networks that report one);
    * ``train/grad_norm``: the last non-zero gradient norm since the previous record (TrainingWrapper reports
      0.0 on calls that do not end an accumulation window or when the norm is not computed; left out when
      every one was 0.0);
    * ``train/skipped_steps``: cumulative count of calls whose ``overflow`` output was True, since this callback
      was created (not restored on resume);
    * ``train/samples_per_second``: ``samples_per_step`` x steps since the previous record / wall time inside
      the epoch. The run's first step (or first sink), which includes graph compilation, and the time between
      epochs (evaluation, checkpoints) are left out.

    Net outputs may be TrainingWrapper's 4-tuple, a 3-tuple ``(loss, overflow, scale)`` or a bare loss Tensor.

    Sink mode (GPU/Ascend graph mode; MindSpore trains without sinking on CPU): the step-end hook fires once
    per sink of ``sink_size`` steps and sees only that sink's last outputs, so ``train/loss`` averages the
    sinks' last losses and ``train/skipped_steps`` counts only overflows on the last step of a sink --
    it undercounts. Steps and throughput are exact, from ``cur_step_num``.

    Reads: a TrainingWrapper built with ``metrics_on_device=True`` (the app's) keeps the loss sum, the skipped
    count and the latest gradient norm on the device (``TrainingWrapper.running_totals``): they are read once per
    record, like ``scalars``, and no step waits for the host. ``train/loss`` is then the mean over every call
    since the previous record (in sink mode too), and ``train/grad_norm`` the finite norm of the latest window
    that computed one (a record whose interval saw a non-finite loss has ``train/loss`` NaN, as with per-step
    reads). Any other network's outputs are read
    every step (a device sync), as MindSpore's LossMonitor does.

    ``scalars`` (e.g. ``TrainingWrapper.logged_scalars()``) are recorded as ``train/<name>`` with their values at
    record time: read only then, they cost no per-step sync.

    Args:
        run_log: where to record; None keeps the values only in ``.last``.
        samples_per_step: samples in one train-network call (the global batch size).
        learning_rate: returns the current learning rate, overriding the optimizer's.
        log_every_n_steps: record when the global step crosses a multiple of this.
        scalars: name -> one-element Tensor (a Parameter the train network updates), recorded as ``train/<name>``.
    """

    order_role = "train_metrics"
    run_after: tuple = ("start_at",)  # every callback after StartAt sees the run's global step

    def __init__(self, run_log: Optional[RunLog], samples_per_step: int,
                 learning_rate: Optional[Callable[[], float]] = None, log_every_n_steps: int = 10,
                 scalars: Optional[Dict[str, Tensor]] = None):
        super().__init__()
        if not isinstance(log_every_n_steps, int) or log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be an int >= 1; got {log_every_n_steps!r}")
        if samples_per_step < 1:
            raise ValueError(f"samples_per_step must be >= 1; got {samples_per_step!r}")
        self.run_log = run_log
        self.samples_per_step = int(samples_per_step)
        self.learning_rate = learning_rate
        self.log_every_n_steps = log_every_n_steps
        self.scalars = checked_scalars(scalars or {})
        self._skipped_steps = 0
        # for a progress display: the latest step's loss, or with running totals on the device the latest record's
        self.current_loss: Optional[float] = None
        self.last: Dict[str, Any] = {}  # the latest record: {"step", "epoch", "train/...": value}
        self._optimizer: Optional[nn.Optimizer] = None
        self._global_step = GlobalStep()
        self._reset_interval()
        self._last_record_step: Optional[int] = None
        self._timing_started = False
        self._base_time = 0.0
        self._base_step = 0
        self._network: Any = None
        self._totals: Dict[str, Any] = {}  # the network's running_totals() when it keeps them on the device
        self._device_skipped_start = 0
        self._nonfinite_seen = 0  # the network's count of non-finite losses at the previous record

    @property
    def skipped_steps(self) -> int:
        """Calls whose ``overflow`` output was True since this callback was created (or since the value set)."""
        if "skipped_steps" in self._totals:
            return self._skipped_steps + int(_scalar(self._totals["skipped_steps"])) - self._device_skipped_start
        return self._skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._skipped_steps = int(value)
        if "skipped_steps" in self._totals:
            self._device_skipped_start = int(_scalar(self._totals["skipped_steps"]))

    def _reset_interval(self) -> None:
        self._losses = []
        self._scale: Any = None  # the latest loss-scale output, read when recorded
        self._grad_norms: list = []  # this interval's grad-norm outputs, read when recorded (the last non-zero)
        self._has_overflow_output = "skipped_steps" in getattr(self, "_totals", {})
        self._calls_since_record = 0

    # ------------------------------------------------------------------ hooks
    # ------------------------------------------------------------------ state (a resume continues the interval)
    def state_dict(self) -> Dict[str, Any]:
        """The interval under way: the step of the last record and what was gathered since (its losses, or with
        running totals on the device the count the device's sum is divided by), so that the first record after a
        resume is the uninterrupted run's."""
        return {"last_record_step": self._last_record_step, "losses": [float(v) for v in self._losses],
                "grad_norms": [_scalar(v) for v in self._grad_norms],
                "scale": None if self._scale is None else _scalar(self._scale)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take :meth:`state_dict`; applied when training begins (after the hooks' own reset)."""
        self._restored = self.checked_state(state)

    @staticmethod
    def checked_state(state: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`state_dict`'s values checked as a run writes them (ValueError/KeyError naming the key)."""
        return {"last_record_step": stored_value(state, "last_record_step", "int", minimum=0, optional=True),
                "losses": stored_value(state, "losses", "floats"),
                "grad_norms": stored_value(state, "grad_norms", "floats"),
                "scale": stored_value(state, "scale", "float", optional=True)}

    _restored: Optional[Dict[str, Any]] = None

    def on_train_begin(self, run_context) -> None:
        params = run_context.original_args()
        self._optimizer = find_optimizer(params)
        self._network = params.get("train_network") if hasattr(params, "get") else None
        totals = getattr(self._network, "running_totals", None)
        skipped = self.skipped_steps
        self._totals = dict(totals()) if callable(totals) else {}
        restored, self._restored = self._restored, None
        if self._totals:  # a checkpoint holds a partial interval's sum: kept when the interval's start is known
            if restored is None or restored["last_record_step"] is None:
                _set_zero(self._totals["loss_sum"])
            self._nonfinite_seen = int(_scalar(self._totals["nonfinite_losses"]))
            self.skipped_steps = skipped
        self._global_step.reset()
        self._last_record_step = None
        self._timing_started = False
        self._reset_interval()
        if restored is not None:  # the interval the checkpoint was written in goes on
            self._last_record_step = restored["last_record_step"]
            self._losses = list(restored["losses"])
            self._grad_norms = list(restored["grad_norms"])
            self._scale = restored["scale"]

    def on_train_epoch_begin(self, run_context) -> None:
        step = self._global_step(run_context.original_args())
        if self._last_record_step is None:
            self._last_record_step = step
        self._base_time = time.perf_counter()
        self._base_step = step

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        step = self._global_step(params)
        if self._last_record_step is None:
            self._last_record_step = step - 1
        if self._totals:
            self._calls_since_record = step - self._last_record_step
        else:
            self._read_outputs(params.net_outputs)
        if not self._timing_started:  # the first step (or sink) includes compilation: time from its end
            self._timing_started = True
            self._base_time, self._base_step = time.perf_counter(), step
        n = self.log_every_n_steps
        if step // n > self._last_record_step // n:
            self.record(params)

    def _read_outputs(self, outputs: Any) -> None:
        """Without running totals on the device: read this call's outputs now."""
        # Loss and overflow are read every step (the interval's mean, the skip count); the loss scale and the
        # gradient norm only when recorded: each read of a Tensor costs tens of microseconds.
        values = list(outputs) + [None] * (4 - len(outputs)) if isinstance(outputs, (tuple, list)) else [outputs]
        values += [None] * (4 - len(values))
        loss, overflow, scale, grad_norm = values[:4]
        self.current_loss = _scalar(loss)
        self._losses.append(self.current_loss)
        if overflow is not None:
            self._has_overflow_output = True
            self._skipped_steps += int(bool(_scalar(overflow)))
        if scale is not None:
            self._scale = scale
        if grad_norm is not None:
            self._grad_norms.append(grad_norm)

    def on_train_epoch_end(self, run_context) -> None:
        params = run_context.original_args()
        if stopped_mid_epoch(run_context):
            return  # a stop after a step: its interval goes on in the continuation, recorded there as uninterrupted
        if self._losses or self._calls_since_record:
            self.record(params)

    # ------------------------------------------------------------------ records
    def record(self, params: Any) -> Dict[str, Any]:
        """Record the values gathered since the previous record at the current global step; returns them."""
        step = self._global_step(params)
        now = time.perf_counter()
        values: Dict[str, float] = {}
        if self._totals:
            values.update(self._read_totals())
        elif self._losses:
            values["train/loss"] = float(np.mean(np.asarray(self._losses, np.float64)))
        lr = self._current_learning_rate()
        if lr is not None:
            values["train/learning_rate"] = lr
        if self._scale is not None:
            values["train/loss_scale"] = _scalar(self._scale)
        grad_norm = next((norm for norm in map(_scalar, reversed(self._grad_norms)) if norm != 0.0), None)
        if grad_norm is not None:  # 0.0 on micro-steps that end no window, and when no norm is computed
            values["train/grad_norm"] = grad_norm
        if self._has_overflow_output:
            values["train/skipped_steps"] = self.skipped_steps
        values.update(self._read_scalars())
        if self._timing_started and step > self._base_step and now > self._base_time:
            values["train/samples_per_second"] = (step - self._base_step) * self.samples_per_step / (
                now - self._base_time)
            self._base_time, self._base_step = now, step
        epoch = params.get("cur_epoch_num") if hasattr(params, "get") else None
        if self.run_log is not None:
            self.run_log.scalars(step, values, epoch=epoch)
        self.last = {"step": step, "epoch": epoch, **values}
        self._last_record_step = step
        self._reset_interval()
        return self.last

    def _read_totals(self) -> Dict[str, float]:
        """The device's running totals, read once for this record; the loss sum starts again from 0."""
        values: Dict[str, float] = {}
        if self._calls_since_record:
            nonfinite = int(_scalar(self._totals["nonfinite_losses"]))
            mean = _scalar(self._totals["loss_sum"]) / self._calls_since_record
            values["train/loss"] = mean if nonfinite == self._nonfinite_seen else float("nan")
            self._nonfinite_seen = nonfinite
            _set_zero(self._totals["loss_sum"])
            self.current_loss = values["train/loss"]
        self._scale = self._totals.get("loss_scale", 1.0)  # the latest call's scale; 1.0 without scaling
        if "grad_norm" in self._totals:
            grad_norm = _scalar(self._totals["grad_norm"])
            if grad_norm != 0.0:
                values["train/grad_norm"] = grad_norm
        return values

    # -------------------------------------------------------------- custom scalars (the wrapper's logged_scalars)
    def _read_scalars(self) -> Dict[str, float]:
        """The custom scalars' values now: one host read each, only at a record."""
        return {f"train/{name}": _scalar(value) for name, value in self.scalars.items()}

    def _current_learning_rate(self) -> Optional[float]:
        if self.learning_rate is not None:
            return float(self.learning_rate())
        if self._optimizer is not None:
            return optimizer_learning_rate(self._optimizer)
        return None


BUILT_IN_TAGS = ("loss", "learning_rate", "loss_scale", "grad_norm", "skipped_steps", "samples_per_second")


def checked_scalars(scalars: Dict[str, Any]) -> Dict[str, Tensor]:
    """`scalars` when each is a one-element Tensor under a new name; ValueError/TypeError naming it otherwise."""
    for name, value in scalars.items():
        if not isinstance(name, str) or not name or name in BUILT_IN_TAGS:
            raise ValueError(f"logged scalar name {name!r} is not valid: it must be a non-empty string other than "
                             f"{', '.join(BUILT_IN_TAGS)}")
        if not isinstance(value, Tensor) or value.size != 1:
            raise TypeError(f"logged scalar {name!r} must be a one-element Tensor (a Parameter the train network "
                            f"updates); got {type(value).__name__}")
    return dict(scalars)
