"""Progress: what a person watching the run sees -- a live line on a terminal, log lines otherwise."""
from __future__ import annotations

import datetime
import logging
import sys
import time
from typing import IO, Optional

from trainkit.callbacks.base import Callback
from trainkit.callbacks.train_metrics import TrainMetrics, step_outputs

logger = logging.getLogger("trainkit")


def format_duration(seconds: Optional[float]) -> str:
    """``3723.4`` -> ``"1:02:03"``; None -> ``"?"``."""
    if seconds is None:
        return "?"
    return str(datetime.timedelta(seconds=int(round(seconds))))


class Progress(Callback):
    """Shows epoch, step, loss, throughput and ETA.

    On a terminal (``stream.isatty()``) one line is rewritten in place (``\\r``) after every step (or sink),
    at most every `refresh_seconds`, and ended with the epoch's time at each epoch end::

        epoch 3/90  step 120/1563  loss 0.1234  1234 samples/s  ETA 1:02:03

    Otherwise (a file, a pipe, a batch job's log) the same line goes to the ``trainkit`` logger every
    `every_n_steps` global steps, and a summary line with the epoch's wall time at each epoch end.

    The step time behind throughput and ETA is an exponential moving average (weight `smoothing` for the
    newest) of the time between step ends within an epoch; the run's first step (or sink), which includes
    graph compilation, is left out, and so is the time between epochs (evaluation, checkpoints), so the ETA
    covers training steps only.

    Args:
        epochs: the number of the last epoch (``Model.train``'s `epoch`).
        steps_per_epoch: steps (train-network calls) per epoch.
        samples_per_step: samples per step (the global batch size).
        stream: where the terminal line goes (default ``sys.stderr``); only used when it is a TTY.
        every_n_steps: log-line interval when not on a terminal.
        train_metrics: when given, its ``current_loss`` and skipped-step count are shown instead of reading
            the network's outputs again: the latest step's loss, or -- with a wrapper that keeps its totals on
            the device (the app's) -- the mean loss of its latest record, the value ``metrics.jsonl`` holds
            for that step.
        refresh_seconds: the least time between two terminal redraws.
        smoothing: weight of the newest step time in the moving average, in (0, 1].
    """

    order_role = "progress"
    run_after: tuple = ("start_at", "train_metrics")  # its line shows what TrainMetrics read of the step

    def __init__(self, epochs: int, steps_per_epoch: int, samples_per_step: int, stream: Optional[IO[str]] = None,
                 every_n_steps: int = 50, train_metrics: Optional[TrainMetrics] = None,
                 refresh_seconds: float = 0.1, smoothing: float = 0.1):
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1; got {every_n_steps!r}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1]; got {smoothing!r}")
        self.epochs = int(epochs)
        self.steps_per_epoch = int(steps_per_epoch)
        self.samples_per_step = int(samples_per_step)
        self.stream = stream if stream is not None else sys.stderr
        self.every_n_steps = every_n_steps
        self.train_metrics = train_metrics
        self.refresh_seconds = refresh_seconds
        self.smoothing = smoothing
        self.step_time: Optional[float] = None  # smoothed seconds per step
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._line_open = False
        self._line_length = 0
        self._last_draw = 0.0
        self._first_step_done = False
        self._epoch = 0
        self._epoch_start_step = 0
        self._epoch_start_time = 0.0
        self._last_step = 0
        self._last_time = 0.0
        self._loss: Optional[float] = None
        self._last_log_step = 0

    @property
    def is_terminal(self) -> bool:
        return self._tty

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, run_context) -> None:
        self._first_step_done = False
        self._last_log_step = int(run_context.original_args().cur_step_num)

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        self._epoch = int(params.cur_epoch_num)
        self._epoch_start_step = self._last_step = int(params.cur_step_num)
        self._epoch_start_time = self._last_time = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        step = int(params.cur_step_num)
        now = time.perf_counter()
        if self._first_step_done and step > self._last_step:
            per_step = (now - self._last_time) / (step - self._last_step)
            self.step_time = per_step if self.step_time is None else (
                self.smoothing * per_step + (1 - self.smoothing) * self.step_time)
        self._first_step_done = True
        self._last_step, self._last_time = step, now
        self._loss = self._current_loss(params)
        if self._tty:
            if now - self._last_draw >= self.refresh_seconds:
                self._draw(self.status_line(step))
                self._last_draw = now
        elif step // self.every_n_steps > self._last_log_step // self.every_n_steps:
            logger.info(self.status_line(step))
            self._last_log_step = step

    def on_train_epoch_end(self, run_context) -> None:
        step = int(run_context.original_args().cur_step_num)
        if self.train_metrics is not None:  # its epoch-end record (made before this runs) is the epoch's last value
            self._loss = self.train_metrics.current_loss
        elapsed = time.perf_counter() - self._epoch_start_time
        if self._tty:
            self._draw(f"{self.status_line(step)}  epoch time {format_duration(elapsed)}")
            self._end_line()
        else:
            steps = step - self._epoch_start_step
            rate = f", {steps * self.samples_per_step / elapsed:.0f} samples/s" if elapsed > 0 else ""
            logger.info("epoch %d/%d done in %.1f s: %d steps, loss %s%s", self._epoch, self.epochs, elapsed,
                        steps, _format_loss(self._loss), rate)

    def on_train_end(self, run_context) -> None:
        if self._line_open:
            self._end_line()

    # ------------------------------------------------------------------ text
    def status_line(self, step: int) -> str:
        """``epoch 3/90  step 120/1563  loss 0.1234  1234 samples/s  ETA 1:02:03`` for global `step`."""
        in_epoch = step - self._epoch_start_step
        parts = [f"epoch {self._epoch}/{self.epochs}", f"step {in_epoch}/{self.steps_per_epoch}",
                 f"loss {_format_loss(self._loss)}"]
        skipped = self.train_metrics.skipped_steps if self.train_metrics is not None else 0
        if skipped:
            parts.append(f"skipped {skipped}")
        if self.step_time:
            parts.append(f"{self.samples_per_step / self.step_time:.0f} samples/s")
        parts.append(f"ETA {format_duration(self.eta_seconds(step))}")
        return "  ".join(parts)

    def eta_seconds(self, step: int) -> Optional[float]:
        """Smoothed step time x the steps left in this and the remaining epochs; None before it is known."""
        if self.step_time is None:
            return None
        in_epoch = step - self._epoch_start_step
        remaining = max(self.steps_per_epoch - in_epoch, 0) + max(self.epochs - self._epoch, 0) * self.steps_per_epoch
        return remaining * self.step_time

    def _current_loss(self, params) -> Optional[float]:
        if self.train_metrics is not None:  # its latest record's mean when it keeps totals on the device
            return self.train_metrics.current_loss
        try:
            return step_outputs(params.net_outputs).loss
        except (AttributeError, IndexError, TypeError, ValueError, KeyError):
            return None

    def _draw(self, line: str) -> None:
        padding = " " * max(self._line_length - len(line), 0)
        self.stream.write("\r" + line + padding)
        self.stream.flush()
        self._line_length = len(line)
        self._line_open = True

    def _end_line(self) -> None:
        self.stream.write("\n")
        self.stream.flush()
        self._line_open = False
        self._line_length = 0
        self._last_draw = 0.0


def _format_loss(loss: Optional[float]) -> str:
    return "?" if loss is None else f"{loss:.4f}"
