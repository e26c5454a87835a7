"""TrainingWrapper: one training step with every feature a serious loop needs, each free when off."""
from __future__ import annotations

import math
from typing import Optional, Tuple

from mindspore import Parameter, ParameterTuple, Tensor, amp, nn, ops
from mindspore import dtype as mstype
from mindspore.context import ParallelMode
from mindspore.parallel._utils import _get_device_num, _get_gradients_mean, _get_parallel_mode

from trainkit import kernels
from trainkit.checks import check_number
from trainkit.step.accumulation import AccumulationWindow, branch_free_window
from trainkit.step.ema import ExponentialMovingAverage, ema_source_parameters
from trainkit.step.fused_optimizer import flat_statistics_kernels, fused_step_kernels, statistics_restore_kernel
from trainkit.step.grad_ops import (
    all_finite,
    copied,
    float32_total,
    multiplied,
    restore_into,
    size_groups,
    small_concat,
    use_fused_add,
)
from trainkit.step.loss_scale import LossScaleArg, make_loss_scaler, next_dynamic_scale
from trainkit.step.running_totals import RUNNING_TOTALS, RunningTotals  # noqa: F401 -- RUNNING_TOTALS: also here


class _ScaledLoss(nn.Cell):
    """Returns ``(loss * sens, loss)`` so one backward pass yields scaled gradients and the plain loss."""

    def __init__(self, network: nn.Cell):
        super().__init__(auto_prefix=False)
        self.network = network

    def construct(self, sens, *inputs):
        loss = self.network(*inputs)
        return loss * sens.astype(loss.dtype), loss


class TrainingWrapper(AccumulationWindow, RunningTotals, nn.Cell):
    """One optimizer step (or one micro-step of an accumulation window) per call.

    Features, each turned on by one argument and free when off (decided here in Python,
    never by a branch in the compiled graph):

    * loss scaling -- ``loss_scale``: static or dynamic; a window whose gradients are not
      finite is skipped (the non-finite guard below is always on with scaling).
    * non-finite guard -- ``skip_nonfinite``: without loss scaling too, a window whose loss or
      gradients (standalone also: batch-norm moving statistics) are not finite is skipped:
      the weights, the optimizer state and the EMA stay as they were, and the moving
      statistics are restored to their values at the window's start.
    * gradient accumulation -- ``accumulation_steps``: micro-batch gradients summed in
      ``_grad_sum``; the optimizer (and so the learning-rate schedule) steps once a window.
    * global-norm clipping -- ``max_grad_norm``: on the accumulated, unscaled, reduced
      gradient right before the optimizer, as ``torch.nn.utils.clip_grad_norm_``.
    * EMA -- ``ema_decay``: shadow weights ``ema.<name>`` after every applied step, or after
      every ``ema_every``-th one with decay ``ema_decay ** ema_every``.
    * data parallel -- from the auto-parallel context: ``nn.DistributedGradReducer``
      averages gradients (every micro-batch, so ranks hold the same window sum) before anything else reads them.
    * metrics on the device -- ``metrics_on_device``: the loss sum, the skipped-window count and
      the latest gradient norm kept in Parameters (``running_totals``) that ``TrainMetrics``
      reads once per record, so no step waits for the host to read its outputs.

    One call reads as (each phase a method a subclass may override)::

        scale = loss scale now (1 when off)
        statistics = save_moving_statistics()   # guard only: moving statistics at the window's start
        loss, grads = compute_grads(scale / accumulation_steps, *inputs)   # still scaled
        if accumulation_steps > 1:
            if the window is not complete:
                accumulate_grads(reduce_grads(grads))  # first micro-step: _grad_sum = g; later: += g
                accumulate_loss(loss)            # guard only: the same into _loss_sum
                return
            grads = window_grads(reduce_grads(grads))   # _grad_sum + g, not written back
        grads = reduce_grads(grads)              # data parallel, no accumulation
        optimizer_step(grads, loss, statistics, scale):
            clipped, grad_norm = unscale_and_transform(grads, scale)   # one pass over the gradients
            finite = step_finite(grads, grad_norm, loss)     # guard only
            update_loss_scale(finite)            # dynamic scaling only
            if finite: apply_grads(clipped)      # optimizer, then EMA
            else: restore_moving_statistics(statistics)

    Where trainkit's kernels build and the optimizer is ``nn.Momentum``, ``nn.Adam`` or ``nn.AdamWeightDecay``,
    ``optimizer_step`` is one kernel call instead (``trainkit.step.fused_optimizer``): the still-scaled gradients,
    the factor ``unscale_and_transform`` would multiply them by, and ``finite`` go in, and on a skipped window
    nothing moves -- no branch in the graph (a subclass overriding a phase that call stands for keeps the above).
    With accumulation too, the window has no branch at all (``trainkit.step.accumulation``): one kernel call keeps
    the sum (assigned on the first micro-step, added after) and returns its norm, and the optimizer's call takes
    ``finite and last``. Where the kernels build, the gradients' norm is one kernel call (``kernels.norm_all_kernel``:
    the squares summed in double, the same bits whatever the thread count) on every path, and so are the moving
    statistics' save and restore (one call each way with a flag, outside any branch; ``_window_start`` written on
    every micro-step of a window, the call copying on its first only), whatever the optimizer.

    The gradients stay multiplied by the loss scale until ``unscale_and_transform``, which
    unscales and clips in one multiply: ``g_s * min(1, c / (||g_s|| / s + 1e-6)) / s`` from the
    norm of the scaled gradients ``||g_s||`` (``unscale_grads`` then ``transform_grads`` when a
    subclass overrides either of them: they see unscaled gradients, one pass more).

    Outputs ``(loss, overflow, loss_scale, grad_norm)``:

    * ``loss``: the unscaled mean loss of this micro-batch (not divided by k);
    * ``overflow``: True when this call ended a window whose update was skipped because
      it was not finite (always False on micro-steps that do not end a window, and when
      neither loss scaling nor ``skip_nonfinite`` is on);
    * ``loss_scale``: the scale this micro-batch was computed with (1.0 when off);
    * ``grad_norm``: the global norm of the accumulated unscaled gradient before
      clipping, on calls that end a window, when ``max_grad_norm`` is set or
      ``compute_grad_norm=True``; 0.0 otherwise.

    Args:
        network: a Cell returning a scalar loss from the batch's inputs (e.g. ``nn.WithLossCell``).
        optimizer: a ``mindspore.nn.Optimizer``; gradients are taken with respect to
            ``optimizer.parameters`` so grouped parameters stay aligned.
        loss_scale: None, a number >= 1 (static scale) or a ``mindspore.amp.StaticLossScaler``
            / ``DynamicLossScaler``. Its Parameters are registered in this Cell as
            ``loss_scale.scale_value`` and ``loss_scale.counter`` (renaming them).
        max_grad_norm: clip the global gradient norm to this value (> 0), or None.
        accumulation_steps: micro-batches per optimizer step (>= 1).
        ema_decay: decay in [0, 1) of the shadow weights, or None.
        ema_warmup: use ``min(ema_decay, (1 + n) / (10 + n))`` for the n-th EMA update.
        ema_every: update the shadows on every ``ema_every``-th applied step only, with the
            decay raised to that power (the same time constant in steps); 1: every step.
        compute_grad_norm: report the gradient norm even when not clipping.
        skip_nonfinite: skip windows that are not finite also without loss scaling (on
            with loss scaling whatever this says).
        metrics_on_device: keep the running totals ``TrainMetrics`` reads at record time
            (``running_totals``) instead of reading every call's outputs.

    Raises:
        TypeError: `network`, `optimizer` or an argument has the wrong type.
        ValueError: an argument is out of its valid range.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, *,
                 loss_scale: LossScaleArg = None,
                 max_grad_norm: Optional[float] = None,
                 accumulation_steps: int = 1,
                 ema_decay: Optional[float] = None,
                 ema_warmup: bool = False,
                 ema_every: int = 1,
                 compute_grad_norm: bool = False,
                 skip_nonfinite: bool = False,
                 metrics_on_device: bool = False):
        super().__init__(auto_prefix=False)
        _check_arguments(network, optimizer, max_grad_norm, accumulation_steps, ema_decay, ema_every)
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.accumulation_steps = int(accumulation_steps)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.compute_grad_norm = bool(compute_grad_norm) or max_grad_norm is not None
        self.hyper_map = ops.HyperMap()
        self.value_and_grad = ops.value_and_grad(_ScaledLoss(network), None, self.weights, has_aux=True)

        # The scaler is a plain Python object: construct reads only what is copied or registered here.
        self.loss_scaler = make_loss_scaler(loss_scale)
        self.loss_scaling = self.loss_scaler is not None
        self.dynamic_loss_scale = isinstance(self.loss_scaler, amp.DynamicLossScaler)
        if self.loss_scaling:
            self.loss_scaler.scale_value.name = "loss_scale.scale_value"
            self.loss_scale_value = self.loss_scaler.scale_value
        if self.dynamic_loss_scale:
            self.loss_scaler.counter.name = "loss_scale.counter"
            self.loss_scale_counter = self.loss_scaler.counter
            self.scale_factor = self.loss_scaler.scale_factor
            self.scale_window = self.loss_scaler.scale_window
        # A static scale of 1 multiplies by 1: its gradients need no unscaling pass.
        self.unscaling = self.loss_scaling and (
            self.dynamic_loss_scale or float(self.loss_scaler.scale_value.asnumpy()) != 1.0)
        # Unscale and clip in one multiply, unless a subclass changed either step (it sees unscaled gradients).
        self.fused_unscale_clip = (type(self).transform_grads is TrainingWrapper.transform_grads
                                   and type(self).unscale_grads is TrainingWrapper.unscale_grads)

        self.fused_accumulate = False
        self.add_into_all = None
        if self.accumulation_steps > 1:
            self._grad_sum = self.weights.clone(prefix="_grad_sum", init="zeros")
            self.micro_step = Parameter(Tensor(0, mstype.int32), name="micro_step", requires_grad=False)
            # One multithreaded pass of a C++ kernel per gradient instead of AssignAdd (trainkit/kernels/); with
            # every weight float32, one call of it for all the gradients.
            kernel = kernels.add_into_kernel()
            if kernel is not None:
                use_fused_add(kernel)
                self.fused_accumulate = True
                if all(weight.dtype == mstype.float32 for weight in self.weights):
                    self.add_into_all = kernels.add_into_all_kernel()

        # The guard: a window that is not finite is skipped and leaves no trace (see step_finite).
        self.skip_nonfinite = bool(skip_nonfinite) or self.loss_scaling
        self.moving_statistics = ()
        if self.skip_nonfinite:
            statistics = moving_statistics_parameters(network, self.weights)
            if statistics:
                self.moving_statistics = ParameterTuple(statistics)
            if statistics and self.accumulation_steps > 1:
                self._window_start = self.moving_statistics.clone(prefix="_window_start", init="same")
            if self.accumulation_steps > 1:
                self._loss_sum = Parameter(Tensor(0.0, mstype.float32), name="_loss_sum", requires_grad=False)
        self.guard_moving_statistics = bool(self.moving_statistics)
        # Reductions over gradients or statistics take the small tensors together (trainkit.step.grad_ops).
        self.grad_groups = size_groups(self.weights)
        self.statistics_groups = size_groups(self.moving_statistics)
        # The finite checks join them by one kernel call where trainkit's kernels build: fewer nodes to compile. Not
        # the norm: MindSpore's ReduceSum of a Concat rounds its last bit otherwise than of the kernel's output.
        self.concat_grads = small_concat(self.weights, self.grad_groups)
        self.concat_statistics = small_concat(self.moving_statistics, self.statistics_groups)
        # The gradients' norm (and their finite check) by one kernel call over them all where the kernels build and
        # every weight is float32: one pass over memory, the squares summed in double (or None: MindSpore's kernels).
        # Whether the norm is a pass of the kernels' where they build (trainkit.rundir.kernel_path reads it too).
        self.fusable_norm = (self.compute_grad_norm or self.skip_nonfinite) and all(
            w.dtype == mstype.float32 for w in self.weights)
        self.norm_all = kernels.norm_all_kernel() if self.fusable_norm else None

        self.ema = None
        if ema_decay is not None:
            self.ema = ExponentialMovingAverage(ema_source_parameters(network), ema_decay, ema_warmup, ema_every)

        # The optimizer step as one kernel call taking the gradient factor and the finite flag: no branch in the graph
        # for the guard. (None, None): MindSpore's optimizer behind the branch (trainkit.step.fused_optimizer).
        self.fused_update, self.restore_statistics_unless = fused_step_kernels(self, TrainingWrapper)
        if self.fused_update is None:  # MindSpore's optimizer behind the branch: the statistics still by one call
            self.restore_statistics_unless = statistics_restore_kernel(self, TrainingWrapper)
        # With that kernel, the moving statistics saved as one flat copy and put back from it (or None, None).
        self.save_statistics_flat, self.restore_statistics_flat_unless = flat_statistics_kernels(self, TrainingWrapper)
        # With it and accumulation, the window with no branch in the graph: the sum's kernel (or None).
        self.accumulate_all = branch_free_window(self, TrainingWrapper)

        self.grad_reducer = None
        if _get_parallel_mode() in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL):
            self.grad_reducer = nn.DistributedGradReducer(self.weights, _get_gradients_mean(), _get_device_num())

        self.metrics_on_device = bool(metrics_on_device)
        if self.metrics_on_device:
            self._loss_total = Parameter(Tensor(0.0, mstype.float32), name="_loss_total", requires_grad=False)
            self._nonfinite_losses = Parameter(Tensor(0, mstype.int32), name="_nonfinite_losses", requires_grad=False)
            self._skipped_total = Parameter(Tensor(0, mstype.int32), name="_skipped_total", requires_grad=False)
            if self.compute_grad_norm:
                self._last_grad_norm = Parameter(Tensor(0.0, mstype.float32), name="_last_grad_norm",
                                                 requires_grad=False)
            if self.loss_scaling:  # the scale the latest call used (the scaler's own may have moved on since)
                self._last_loss_scale = Parameter(Tensor(1.0, mstype.float32), name="_last_loss_scale",
                                                  requires_grad=False)

        self._one = Tensor(1.0, mstype.float32)
        self._zero = Tensor(0.0, mstype.float32)
        self._false = Tensor(False, mstype.bool_)
        self._true = Tensor(True, mstype.bool_)

    # ----------------------------------------------------------------- the step
    def construct(self, *inputs):
        scale = self.current_loss_scale()
        if self.accumulate_all is not None:  # decided in __init__ (trainkit.step.accumulation)
            loss, overflow, grad_norm = self.branch_free_window_step(scale, *inputs)
        else:
            statistics = self.save_moving_statistics()
            loss, grads = self.compute_grads(scale / self.accumulation_steps, *inputs)
            if self.accumulation_steps == 1:
                overflow, grad_norm = self.optimizer_step(self.reduce_grads(grads), loss, statistics, scale)
            else:
                overflow, grad_norm = self.accumulation_step(grads, loss, statistics, scale)
        if self.metrics_on_device:
            self.add_to_running_totals(loss, overflow, grad_norm, scale)
        return loss, overflow, scale, grad_norm

    # ------------------------------------------------------- override points
    def current_loss_scale(self) -> Tensor:
        """The loss scale for this micro-batch (a copy, so later adjustment does not alter it)."""
        if not self.loss_scaling:
            return self._one
        return self.loss_scale_value * 1

    def save_moving_statistics(self) -> tuple:
        """What a skipped window restores the moving statistics to: their values at the window's start.

        Guard only. One window is one call: a copy taken before the forward pass (one flat copy by one
        kernel call where the kernels build). A window of several calls: ``_window_start.<name>``,
        written on the window's first call with no branch in the graph (a Parameter, so a checkpoint
        taken inside the window holds it).
        """
        if not self.guard_moving_statistics:
            return ()
        if self.accumulation_steps == 1:
            if self.save_statistics_flat is not None:  # one flat copy
                return (self.save_statistics_flat(*self.moving_statistics),)
            return self.hyper_map(copied, self.moving_statistics)
        self._save_window_start(self.micro_step == 0)
        return self._window_start

    def compute_grads(self, sens: Tensor, *inputs) -> Tuple[Tensor, tuple]:
        """Forward and backward once: returns the plain loss and the gradients of ``loss * sens``."""
        (_, loss), grads = self.value_and_grad(sens, *inputs)
        return loss, grads

    def reduce_grads(self, grads: tuple) -> tuple:
        """Average gradients over data-parallel ranks (identity when standalone); every micro-batch."""
        if self.grad_reducer is None:
            return grads
        return self.grad_reducer(grads)

    def unscale_grads(self, grads: tuple, scale: Tensor) -> tuple:
        """Divide gradients by the loss scale they were computed with (identity when there is none)."""
        if not self.unscaling:
            return grads
        return self.hyper_map(ops.partial(multiplied, ops.reciprocal(scale)), grads)

    def step_finite(self, grads: tuple, grad_norm: Tensor, loss: Tensor) -> Tensor:
        """Whether a window may be applied (guard only; True otherwise).

        Its gradients must be finite: ``isfinite`` of their norm (one scalar; the norm of non-finite
        gradients is not finite -- nor is one that exceeds float32), by the norm kernel's pass where
        the kernels build, else one float32 sum of them all (``all_finite``: a sum that overflows
        float32 counts as not finite too). `grads` may still be
        multiplied by the loss scale: a finite scale >= 1 changes neither answer, except that
        values within a factor of the scale of float32's limit then count as not finite.
        Standalone, also its loss and the moving statistics; in data parallel only the reduced
        gradients decide, the same on every rank (a rank's non-finite loss reaches them through
        the reduction).
        """
        if not self.skip_nonfinite:
            return self._true
        if self.compute_grad_norm:
            finite = ops.isfinite(grad_norm)
        elif self.norm_all is not None:
            finite = ops.isfinite(self.global_norm(grads))
        else:
            finite = all_finite(self.hyper_map, grads, self.grad_groups, self.concat_grads)
        return self.window_finite(finite, loss)

    def window_finite(self, finite: Tensor, loss: Tensor) -> Tensor:
        """`finite` (the gradients'), and, standalone, the loss's and the moving statistics' (see ``step_finite``)."""
        if self.grad_reducer is not None:
            return finite
        finite = ops.logical_and(finite, ops.isfinite(loss))
        if self.guard_moving_statistics:
            statistics = self.moving_statistics  # the kernel copies them as they are now (after the forward pass)
            if self.concat_statistics is None:
                statistics = self.hyper_map(copied, self.moving_statistics)
            finite = ops.logical_and(finite, all_finite(self.hyper_map, statistics, self.statistics_groups,
                                                        self.concat_statistics))
        return finite

    def update_loss_scale(self, finite: Tensor) -> None:
        """Back off on overflow, grow after ``scale_window`` good steps (dynamic scaling only)."""
        if self.dynamic_loss_scale:
            scale, counter = next_dynamic_scale(self.loss_scale_value, self.loss_scale_counter, finite,
                                                self.scale_factor, self.scale_window)
            ops.assign(self.loss_scale_value, scale)
            ops.assign(self.loss_scale_counter, counter)

    def transform_grads(self, grads: tuple) -> Tuple[tuple, Tensor]:
        """Clip unscaled gradients to ``max_grad_norm``; returns them and their global norm before clipping."""
        if not self.compute_grad_norm:
            return grads, self._zero
        grad_norm = self.global_norm(grads)
        if self.max_grad_norm is None:
            return grads, grad_norm
        return self.hyper_map(ops.partial(multiplied, self.clip_coefficient(grad_norm)), grads), grad_norm

    def unscale_and_transform(self, grads: tuple, scale: Tensor) -> Tuple[tuple, Tensor]:
        """Unscale and clip still-scaled gradients; returns them and the unscaled norm before clipping.

        One multiply per gradient, by ``min(1, max_grad_norm / (norm + 1e-6)) / scale`` where
        ``norm = ||g_s|| / scale`` is taken from the scaled gradients; no pass at all without
        scaling and clipping. A subclass overriding ``unscale_grads`` or ``transform_grads`` gets
        them called in turn instead.
        """
        if not self.fused_unscale_clip:
            return self.transform_grads(self.unscale_grads(grads, scale))
        if not self.unscaling:
            return self.transform_grads(grads)
        if not self.compute_grad_norm:
            return self.unscale_grads(grads, scale), self._zero
        inverse_scale = ops.reciprocal(scale)
        grad_norm = self.global_norm(grads) * inverse_scale
        factor = inverse_scale if self.max_grad_norm is None else self.clip_coefficient(grad_norm) * inverse_scale
        return self.hyper_map(ops.partial(multiplied, factor), grads), grad_norm

    def global_norm(self, grads: tuple) -> Tensor:
        """The float32 global L2 norm of `grads` (shaped as the optimizer's parameters): by one kernel call where they
        build (``kernels.norm_all_kernel``: the squares summed in double), else a float32 sum of squares."""
        if self.norm_all is not None:
            return self.norm_all(*grads).reshape(())
        return ops.sqrt(float32_total(self.hyper_map, grads, self.grad_groups, squared=True))

    def clip_coefficient(self, grad_norm: Tensor) -> Tensor:
        """``min(1, max_grad_norm / (grad_norm + 1e-6))``, as ``torch.nn.utils.clip_grad_norm_``."""
        return ops.minimum(self.max_grad_norm / (grad_norm + 1e-6), 1.0)

    def apply_grads(self, grads: tuple) -> Tensor:
        """Take the optimizer step, then update the EMA shadows."""
        applied = self.optimizer(grads)
        if self.ema is not None:
            applied = ops.depend(self.ema(), applied)
        return applied

    def restore_moving_statistics(self, statistics: tuple) -> None:
        """Put back the moving statistics `save_moving_statistics` kept (after a skipped window)."""
        if self.guard_moving_statistics:
            self.hyper_map(restore_into, self.moving_statistics, statistics)

    def optimizer_step(self, grads: tuple, loss: Tensor, statistics: tuple,
                       scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Unscale, clip, check and apply one window's gradients; returns (overflow, grad_norm).

        `grads` are the window's reduced gradients, still multiplied by `scale` (the loss scale
        they were computed with; None: not scaled); `loss` is the window's loss (summed over its
        micro-batches when the guard is on), `statistics` what ``save_moving_statistics`` returned.
        """
        if scale is None:
            scale = self._one
        if self.fused_update is not None:
            return self._fused_optimizer_step(grads, loss, statistics, scale)
        clipped, grad_norm = self.unscale_and_transform(grads, scale)
        finite = self.step_finite(grads, grad_norm, loss)
        if self.dynamic_loss_scale:  # decided here: a call that does nothing is an empty side-effect node in the graph
            self.update_loss_scale(finite)
        # Two branches on purpose: without the guard the graph holds no condition at all.
        if not self.skip_nonfinite:
            self.apply_grads(clipped)
            return self._false, grad_norm
        if self.restore_statistics_unless is None:  # decided in __init__: a subclass's own restore, or no kernels
            if finite:
                self.apply_grads(clipped)
            else:
                self.restore_moving_statistics(statistics)
            return ops.logical_not(finite), grad_norm
        if finite:
            self.apply_grads(clipped)
        # The statistics put back by one kernel call with the flag, outside the branch (as the fused step does).
        return ops.depend(ops.logical_not(finite), self._restore_statistics_unless(statistics, finite)), grad_norm

    def gradient_factor(self, grads: tuple, scale: Tensor) -> Tuple[Tensor, Tensor]:
        """What ``unscale_and_transform`` multiplies the gradients by, and the unscaled norm: ``(factor, norm)``."""
        return self.factor_from_norm(self.global_norm(grads) if self.compute_grad_norm else self._zero, scale)

    def factor_from_norm(self, scaled_norm: Tensor, scale: Tensor) -> Tuple[Tensor, Tensor]:
        """``gradient_factor`` from the norm of the still-scaled gradients (ignored unless ``compute_grad_norm``)."""
        grad_norm = self._zero
        if self.compute_grad_norm:
            grad_norm = scaled_norm
            if self.unscaling:
                grad_norm = grad_norm * ops.reciprocal(scale)
        factor = self._one if self.max_grad_norm is None else self.clip_coefficient(grad_norm)
        if self.unscaling:
            factor = ops.reciprocal(scale) if self.max_grad_norm is None else factor * ops.reciprocal(scale)
        return factor, grad_norm

    def _fused_optimizer_step(self, grads: tuple, loss: Tensor, statistics: tuple,
                              scale: Tensor) -> Tuple[Tensor, Tensor]:
        """``optimizer_step`` as one kernel call with the factor and the finite flag: no branch in the graph."""
        factor, grad_norm = self.gradient_factor(grads, scale)
        finite = self.step_finite(grads, grad_norm, loss)
        if self.dynamic_loss_scale:
            self.update_loss_scale(finite)
        applied = self.fused_update(grads, factor, finite)
        if self.ema is not None:
            applied = ops.depend(self.ema.update_if(finite), applied)
        if not self.skip_nonfinite:
            return ops.depend(self._false, applied), grad_norm
        if self.guard_moving_statistics:
            applied = ops.depend(self._restore_statistics_unless(statistics, finite), applied)
        return ops.depend(ops.logical_not(finite), applied), grad_norm

    def _restore_statistics_unless(self, statistics: tuple, finite: Tensor) -> Tensor:
        """Put back what ``save_moving_statistics`` kept unless `finite`, by one kernel call (the flat copy's, or
        the ``_window_start`` Parameters'): no branch in the graph, nothing written on a finite window."""
        if self.restore_statistics_flat_unless is not None:
            return self.restore_statistics_flat_unless(*self.moving_statistics, statistics[0], finite)
        return self.restore_statistics_unless(*self.moving_statistics, *statistics, finite)


def moving_statistics_parameters(network: nn.Cell, weights) -> list:
    """The floating-point parameters of `network` that its forward pass writes, e.g. batch-norm
    ``moving_mean``/``moving_variance``: those that take no gradient and are not in `weights`."""
    trained = {id(w) for w in weights}
    return [p for p in network.get_parameters()
            if not p.requires_grad and id(p) not in trained and p.dtype in (mstype.float16, mstype.float32,
                                                                            mstype.float64, mstype.bfloat16)]


def _check_arguments(network, optimizer, max_grad_norm, accumulation_steps, ema_decay, ema_every) -> None:
    """Raise TypeError/ValueError naming the argument and what is valid."""
    if not isinstance(network, nn.Cell):
        raise TypeError(f"network must be a mindspore.nn.Cell returning the loss; got {type(network).__name__}")
    if not isinstance(optimizer, nn.Optimizer):
        raise TypeError(f"optimizer must be a mindspore.nn.Optimizer; got {type(optimizer).__name__}")
    check_number("accumulation_steps", accumulation_steps, "an int >= 1", lambda v: v >= 1, types=(int,))
    if max_grad_norm is not None:
        check_number("max_grad_norm", max_grad_norm, "None or a finite number > 0",
                      lambda v: math.isfinite(v) and v > 0)
    if ema_decay is not None:
        check_number("ema_decay", ema_decay, "None or a number in [0, 1)", lambda v: 0 <= v < 1)
    check_number("ema_every", ema_every, "an int >= 1", lambda v: v >= 1, types=(int,))

