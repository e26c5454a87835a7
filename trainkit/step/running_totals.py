"""What the app logs from the train step without a device read per step: the wrapper's running totals.

A mixin of :class:`trainkit.step.wrapper.TrainingWrapper` (its ``construct`` adds each call to the totals when
``metrics_on_device`` is on; ``TrainMetrics`` reads them only when it records), and the hook a subclass overrides
to log state of its own.
"""
from __future__ import annotations

from typing import Dict

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype

#: The Parameters of ``metrics_on_device``: always finite (a non-finite loss is counted, not summed; a non-finite
#: norm is not kept), so a checkpoint of a diverging run's last good state stays finite. Saved with the rest;
#: a resume tolerates their absence on either side (``checkpoint.restore``).
RUNNING_TOTALS = ("_loss_total", "_nonfinite_losses", "_skipped_total", "_last_grad_norm", "_last_loss_scale")


class RunningTotals:
    """The running totals' update and what reads them; the Parameters themselves are made in the wrapper's
    ``__init__`` (``_loss_total``, ...), where ``metrics_on_device``, ``compute_grad_norm`` and ``loss_scaling``
    are decided."""

    # ------------------------------------------------------ metrics on the device
    def add_to_running_totals(self, loss: Tensor, overflow: Tensor, grad_norm: Tensor, scale: Tensor) -> None:
        """Add this call to ``running_totals`` (``metrics_on_device`` only)."""
        loss = loss.astype(mstype.float32)
        finite = ops.isfinite(loss)
        ops.assign_add(self._loss_total, ops.select(finite, loss, self._zero))
        ops.assign_add(self._nonfinite_losses, ops.logical_not(finite).astype(mstype.int32))
        ops.assign_add(self._skipped_total, overflow.astype(mstype.int32))
        if self.compute_grad_norm:
            kept = ops.logical_and(grad_norm != 0, ops.isfinite(grad_norm))
            ops.assign(self._last_grad_norm, ops.select(kept, grad_norm, self._last_grad_norm))
        if self.loss_scaling:
            ops.assign(self._last_loss_scale, scale)

    def running_totals(self) -> Dict[str, Parameter]:
        """What ``TrainMetrics`` reads at record time when ``metrics_on_device`` is on (else ``{}``).

        * ``loss_sum``: the sum of the calls' finite losses since ``TrainMetrics`` last set it to 0;
        * ``nonfinite_losses``: how many calls' losses were not finite, so far;
        * ``skipped_steps``: the number of skipped windows so far;
        * ``grad_norm``: the finite gradient norm of the latest window that computed one (0 before);
        * ``loss_scale``: the scale the latest call was computed with (with loss scaling).
        """
        if not self.metrics_on_device:
            return {}
        totals = {"loss_sum": self._loss_total, "nonfinite_losses": self._nonfinite_losses,
                  "skipped_steps": self._skipped_total}
        if self.compute_grad_norm:
            totals["grad_norm"] = self._last_grad_norm
        if self.loss_scaling:
            totals["loss_scale"] = self._last_loss_scale
        return totals

    # ---------------------------------------------------------- what the app records (the wrapper's logged_scalars)
    def logged_scalars(self) -> Dict[str, Parameter]:
        """Scalars to record as ``train/<name>`` at each record (TensorBoard and metrics.jsonl); none here.

        Override in a subclass to log state of your own: return one-element Parameters that ``construct`` updates
        (``ops.assign``/``ops.assign_add``). ``TrainMetrics`` reads them only when it records, every
        ``logger.log_every_n_steps`` steps, so logging them costs no device sync per step. Being Parameters of the
        wrapper, they are saved in checkpoints and restored on resume too.
        """
        return {}
