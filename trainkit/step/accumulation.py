"""The accumulation window of :class:`trainkit.step.wrapper.TrainingWrapper` (``accumulation_steps > 1``).

Two forms, chosen in the wrapper's ``__init__``:

* with the fused optimizer step (trainkit's kernels, ``trainkit.step.fused_optimizer``): no branch in the graph.
  Every micro-step runs the same nodes: the sum kept by one kernel call that assigns on the window's first
  micro-step and adds after, and returns the norm of the sum as written in the same pass (``TrainkitAccumulateAll``);
  the checks read that norm; the optimizer's kernel is called with ``finite and last``, which does nothing on the
  other micro-steps. The graph ``if`` this replaces ran on CPU with the gradients crossing into a subgraph, and
  restored the window's moving statistics per tensor inside it (ResNet-50, 4 micro-batches of 8: the window 1.05x
  four bare steps before, 0.91x without it).
* otherwise, ``if micro_step == accumulation_steps - 1:`` in the graph: the override points below
  (``accumulate_grads``, ``window_grads``, ``accumulate_loss``, ``window_loss``) on the other micro-steps,
  ``optimizer_step`` on the last.

In both, the guard's copy of the moving statistics at the window's start (``_window_start.*``, Parameters so that a
checkpoint taken inside a window holds it) is written by :meth:`AccumulationWindow._save_window_start` on every
micro-step with the flag ``first`` and no branch: one kernel call for all of them where trainkit's kernels build (it
writes only on the window's first micro-step), else a select per tensor. A skipped window puts them back by one
kernel call too (the wrapper's ``restore_statistics_unless``), where the kernels build.

Both are bitwise the same arithmetic: the window's sum is ``((g0 + g1) + g2) + ...`` in float32 either way, and its
norm is ``kernels.norm_all_kernel``'s sum of squares (the branch's ``global_norm`` calls that kernel).
"""
from __future__ import annotations

from typing import Tuple

from mindspore import Tensor, ops
from mindspore import dtype as mstype

from trainkit import kernels
from trainkit.step.grad_ops import add_into, add_into_fused, added, put_into, put_into_if
from trainkit.step.loss_scale import next_dynamic_scale

#: What the branch-free window stands for: a subclass overriding any of these keeps the branch.
_PHASES = ("accumulate_grads", "window_grads", "accumulate_loss", "window_loss", "save_moving_statistics",
           "restore_moving_statistics", "update_loss_scale", "optimizer_step", "gradient_factor", "step_finite")


def branch_free_window(wrapper, base: type):
    """The kernel :meth:`AccumulationWindow.branch_free_window_step` keeps the sum with, or None where the window
    keeps its branch: no accumulation, no fused optimizer step, a weight that is not float32, or a subclass of
    `base` overriding a phase the branch-free step stands for."""
    if wrapper.accumulation_steps == 1 or wrapper.fused_update is None or wrapper.add_into_all is None:
        return None
    if wrapper.guard_moving_statistics and wrapper.restore_statistics_unless is None:
        return None
    if any(getattr(type(wrapper), name) is not getattr(base, name) for name in _PHASES):
        return None
    return kernels.accumulate_all_kernel()


class AccumulationWindow:
    """The wrapper's accumulation micro-steps (a mixin: the Parameters ``_grad_sum.*``, ``micro_step``,
    ``_loss_sum`` and ``_window_start.*`` are made in the wrapper's ``__init__``)."""

    def branch_free_window_step(self, scale: Tensor, *inputs) -> Tuple[Tensor, Tensor, Tensor]:
        """One micro-step with no branch around it; returns ``(loss, overflow, grad_norm)``.

        Every micro-step keeps the sum and its norm, and calls the optimizer's kernel, the EMA's and the statistics'
        restore with their flags; before the window's last none of them writes anything. The norm comes out of the
        sum's kernel in the same pass over memory, so the checks need no ``if last`` around them (it cost about
        7 ms a micro-step on ResNet-50, and the norm by MindSpore's kernels 15 ms a window).
        """
        micro_step = self.micro_step * 1  # read before the assign below
        first = micro_step == 0
        last = micro_step == self.accumulation_steps - 1
        ops.assign(self.micro_step, (micro_step + 1) % self.accumulation_steps)
        if self.guard_moving_statistics:  # the window's start, written on its first micro-step
            self._save_window_start(first)
        loss, grads = self.compute_grads(scale / self.accumulation_steps, *inputs)
        # The kernel's output: the norm of the sum as written (of the whole window on its last micro-step).
        scaled_norm = self.accumulate_all(*self._grad_sum, *self.reduce_grads(grads), first).reshape(())
        window = ops.depend(self._grad_sum, scaled_norm)
        factor, grad_norm = self.factor_from_norm(scaled_norm, scale)
        finite = self._true
        if self.skip_nonfinite:
            micro_loss = loss.astype(mstype.float32)
            window_loss = ops.select(first, micro_loss, self._loss_sum + micro_loss)
            ops.assign(self._loss_sum, window_loss)
            # What the window's last micro-step decides by; before it the checks read a part of the window.
            finite = ops.logical_or(self.window_finite(ops.isfinite(scaled_norm), window_loss), ops.logical_not(last))
        grad_norm = ops.select(last, grad_norm, self._zero)
        apply = ops.logical_and(finite, last)
        if self.dynamic_loss_scale:
            new_scale, counter = next_dynamic_scale(self.loss_scale_value, self.loss_scale_counter, finite,
                                                    self.scale_factor, self.scale_window)
            ops.assign(self.loss_scale_value, ops.select(last, new_scale, self.loss_scale_value))
            ops.assign(self.loss_scale_counter, ops.select(last, counter, self.loss_scale_counter))
        applied = self.fused_update(window, factor, apply)
        if self.ema is not None:
            applied = ops.depend(self.ema.update_if(apply), applied)
        if self.guard_moving_statistics:  # a skipped window puts back its start (finite is True before the last)
            applied = ops.depend(self.restore_statistics_unless(*self.moving_statistics, *self._window_start, finite),
                                 applied)
        return loss, ops.depend(ops.logical_not(finite), applied), grad_norm

    def _save_window_start(self, first: Tensor) -> Tensor:
        """Copy the moving statistics into ``_window_start`` where `first` (the window's first micro-step) holds,
        with no branch in the graph: one kernel call for them all where the kernels build and they are float32
        (``restore_statistics_unless``, decided in ``__init__``), else a select and an assign per tensor."""
        if self.restore_statistics_unless is not None:
            return self.restore_statistics_unless(*self._window_start, *self.moving_statistics, ops.logical_not(first))
        return self.hyper_map(ops.partial(put_into_if, first), self._window_start, self.moving_statistics)

    def accumulation_step(self, grads: tuple, loss: Tensor, statistics: tuple,
                          scale: Tensor) -> Tuple[Tensor, Tensor]:
        """One micro-step with the window's branch; returns ``(overflow, grad_norm)``."""
        micro_step = self.micro_step * 1  # read before the assign below
        ops.assign(self.micro_step, (micro_step + 1) % self.accumulation_steps)
        overflow = self._false
        grad_norm = self._zero
        # Data parallel: reduced every micro-step, so every rank holds the same window sum and rank 0's checkpoint
        # (written mid-window too: checkpoint_every_n_steps, a polite stop) restores every rank exactly.
        grads = self.reduce_grads(grads)
        if micro_step == self.accumulation_steps - 1:
            window_loss = self.window_loss(loss)
            overflow, grad_norm = self.optimizer_step(self.window_grads(grads), window_loss, statistics, scale)
        else:
            self.accumulate_grads(grads, micro_step == 0)
            self.accumulate_loss(loss, micro_step == 0)
        return overflow, grad_norm

    def accumulate_grads(self, grads: tuple, first: Tensor) -> None:
        """Keep a micro-batch's gradients in ``_grad_sum``: assigned on a window's first call, added after."""
        if first:
            self.hyper_map(put_into, self._grad_sum, grads)
        elif self.add_into_all is not None:
            self.add_into_all(*self._grad_sum, *grads)
        else:
            self.hyper_map(add_into_fused if self.fused_accumulate else add_into, self._grad_sum, grads)

    def window_grads(self, grads: tuple) -> tuple:
        """The window's sum on its last call: ``_grad_sum + grads``, handed on and not written back (the next
        window's first call overwrites the buffer, so it is never cleared)."""
        return self.hyper_map(added, self._grad_sum, grads)

    def accumulate_loss(self, loss: Tensor, first: Tensor) -> None:
        """Keep a micro-batch's loss in ``_loss_sum`` (guard only): finite only if every loss of the window is."""
        if self.skip_nonfinite:
            if first:
                ops.assign(self._loss_sum, loss.astype(mstype.float32))
            else:
                ops.assign_add(self._loss_sum, loss.astype(mstype.float32))

    def window_loss(self, loss: Tensor) -> Tensor:
        """The window's loss sum on its last call (guard only; else the call's loss)."""
        if not self.skip_nonfinite:
            return loss
        return self._loss_sum + loss.astype(mstype.float32)
