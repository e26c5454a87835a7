"""NonFiniteStop: end a run that keeps skipping updates for non-finite values, after saving its last good state."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional

from trainkit.callbacks.base import Callback
from trainkit.callbacks.steps import GlobalStep, _scalar
from trainkit.errors import TrainingError

logger = logging.getLogger("trainkit")


class NonFiniteStop(Callback):
    """Stops training with a ``TrainingError`` after `max_consecutive` consecutive skipped updates.

    An update is skipped when the train network reports ``overflow`` (TrainingWrapper's second output: its
    window's loss or gradients were not finite). Without loss scaling a skipped update does not fix itself --
    no scale backs off -- so a run that skips every update only burns time. A skipped update leaves the
    wrapper's state as the last applied one left it (weights, optimizer, EMA, batch-norm statistics), so
    `save_checkpoint`, called just before the error, saves the last good state (the data has moved on).

    Updates are counted, not micro-batches: an applied update resets the count, and a call that does not end
    an accumulation window (TrainingWrapper's ``micro_step`` is not 0 after it) changes nothing. In dataset
    sink mode (GPU/Ascend) only each sink's last step is seen, as in TrainMetrics. Meant for runs without loss
    scaling: with dynamic scaling, skipped steps are how the scale finds its level.

    Args:
        max_consecutive: the number of consecutive skipped updates that stops the run (>= 1).
        save_checkpoint: saves the train network's current state and returns the file; None saves nothing.

    Raises:
        ValueError: `max_consecutive` is not an int >= 1.
        TrainingError: from ``on_train_step_end`` when the limit is reached; the message names the step.
    """

    order_role = "nonfinite_stop"
    run_after: tuple = ("start_at", "train_metrics", "progress")  # a step's line is printed before a stop it causes

    def __init__(self, max_consecutive: int, save_checkpoint: Optional[Callable[[], Path]] = None):
        super().__init__()
        if isinstance(max_consecutive, bool) or not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise ValueError(f"max_consecutive must be an int >= 1; got {max_consecutive!r}")
        self.max_consecutive = max_consecutive
        self.save_checkpoint = save_checkpoint
        self.consecutive = 0
        self.first_skipped_step: Optional[int] = None
        self._global_step = GlobalStep()

    def on_train_begin(self, run_context) -> None:
        self.consecutive = 0
        self.first_skipped_step = None
        self._global_step.reset()

    def on_train_epoch_begin(self, run_context) -> None:
        self._global_step(run_context.original_args())  # fixes the step offset of a resumed run

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        outputs = params.net_outputs  # only the overflow flag is read: one device read a step, not four
        overflow = bool(_scalar(outputs[1])) if isinstance(outputs, (tuple, list)) and len(outputs) > 1 else None
        step = self._global_step(params)
        if overflow:
            self.consecutive += 1
            if self.first_skipped_step is None:
                self.first_skipped_step = step
        elif _ended_a_window(params.get("train_network")):
            self.consecutive = 0
            self.first_skipped_step = None
        if self.consecutive >= self.max_consecutive:
            self._stop(step, params.get("cur_epoch_num"))

    def _stop(self, step: int, epoch: Optional[int]) -> None:
        saved = "nothing was saved"
        if self.save_checkpoint is not None:
            saved = f"the last good state was saved to {self.save_checkpoint()}"
        message = (f"training stopped at step {step} (epoch {epoch}): {self.consecutive} consecutive updates "
                   f"(steps {self.first_skipped_step} to {step}) were skipped because their loss or gradients were "
                   f"not finite, the limit of {self.max_consecutive} (trainer.max_nonfinite_steps); {saved}. Lower "
                   "the learning rate, clip gradients (wrapper.max_grad_norm) or check the data around these steps")
        logger.error("%s", message)
        raise TrainingError(message)


def _ended_a_window(train_network) -> bool:
    """Whether the call just made ended an accumulation window (always, without accumulation)."""
    micro_step = getattr(train_network, "micro_step", None)
    if micro_step is None or getattr(train_network, "accumulation_steps", 1) == 1:
        return True
    return int(micro_step.asnumpy()) == 0
