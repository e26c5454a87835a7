"""One optimizer step for all tensors in one C++ call that also unscales, clips and skips a non-finite window.

The guard's ``if finite: optimizer(grads)`` is control flow in the graph: MindSpore runs it on CPU with the
optimizer's inputs crossing into a subgraph (8-20 ms a ResNet-50 step, more memory, and twice the compile time
of the features). The kernels in ``trainkit/kernels/fused.cc`` (``TrainkitMomentumAll``, ``TrainkitAdamAll``...)
take the gradient factor (``unscale x clip``) and the finite flag instead: on a non-finite step no weight, moment,
beta power or step counter moves, as when the branch skipped the optimizer. Used for the optimizers whose update
they repeat (:func:`fused_optimizer_update`); any other runs MindSpore's own, behind the branch.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn
from mindspore import dtype as mstype

from trainkit import kernels


def _entry_point(optimizer: nn.Optimizer) -> Optional[str]:
    """The kernel that repeats `optimizer`'s update, or None when it has none (or a feature the kernels lack)."""
    plain = (not optimizer.is_group and not optimizer.dynamic_weight_decay and not optimizer.need_scale
             and not getattr(optimizer, "use_parallel", False)
             and all(p.dtype == mstype.float32 for p in optimizer.parameters) and len(optimizer.parameters) > 0)
    if not plain:
        return None
    if type(optimizer) is nn.Momentum:
        # MindSpore 2.10's CPU ApplyMomentum ignores use_nesterov: a Nesterov kernel would change its results.
        return None if optimizer.use_nesterov else "TrainkitMomentumAll"
    if type(optimizer) is nn.Adam:
        if optimizer.use_nesterov or optimizer.use_amsgrad or optimizer.use_lazy or optimizer.use_offload:
            return None
        return "TrainkitAdamAll"
    if type(optimizer) is nn.AdamWeightDecay and optimizer.use_fused_opt:
        return "TrainkitAdamWeightDecayAll"
    return None


def repeats(optimizer: nn.Optimizer) -> bool:
    """Whether trainkit's kernels repeat `optimizer`'s update (and so take it where they build)."""
    return _entry_point(optimizer) is not None


class FusedOptimizerUpdate(nn.Cell):
    """``optimizer(grads * factor)`` when `finite`, else nothing at all, in one kernel call; `optimizer`'s own
    Parameters (weights, moments, beta powers, ``global_step``) are the ones written, so checkpoints and resume
    see no difference. Build it with :func:`fused_optimizer_update`."""

    def __init__(self, optimizer: nn.Optimizer, entry_point: str, kernel):
        super().__init__(auto_prefix=False)
        self.kernel = kernel
        self.entry_point = entry_point
        self.weights = optimizer.parameters
        self.global_step = optimizer.global_step
        self.dynamic_lr = optimizer.dynamic_lr
        self.learning_rate = optimizer.learning_rate
        # The optimizer's weight decay where its filter applies it (not to `beta`/`gamma` names), else 0.
        decay = np.float32(optimizer.weight_decay.asnumpy()) if optimizer.exec_weight_decay else np.float32(0)
        self.decay = Tensor(np.array([decay if flag else np.float32(0) for flag in optimizer.decay_flags],
                                     np.float32))
        self.adam = entry_point in ("TrainkitAdamAll", "TrainkitAdamWeightDecayAll")
        if entry_point == "TrainkitAdamAll":
            self.moments = ParameterTuple(tuple(optimizer.moment1) + tuple(optimizer.moment2))
            self.betas = (optimizer.beta1, optimizer.beta2, optimizer.eps)
            self.beta1_power, self.beta2_power = optimizer.beta1_power, optimizer.beta2_power
        elif self.adam:  # AdamWeightDecay: no bias correction, so no beta powers (the kernel's go unused)
            self.moments = ParameterTuple(tuple(optimizer.moments1) + tuple(optimizer.moments2))
            self.betas = (optimizer.beta1.reshape(()), optimizer.beta2.reshape(()), optimizer.eps.reshape(()))
            self.beta1_power = Parameter(Tensor(1.0, mstype.float32), name="_unused_beta1_power",
                                         requires_grad=False)
            self.beta2_power = Parameter(Tensor(1.0, mstype.float32), name="_unused_beta2_power",
                                         requires_grad=False)
        else:
            self.moments = optimizer.moments
            self.momentum = optimizer.momentum

    def current_lr(self) -> Tensor:
        """The learning rate of this step, read before the kernel moves ``global_step`` (as ``get_lr``)."""
        if self.dynamic_lr:
            return self.learning_rate(self.global_step).reshape(())
        return self.learning_rate

    def construct(self, grads, factor, finite):
        lr = self.current_lr()
        if self.adam:
            beta1, beta2, eps = self.betas
            return self.kernel(*self.weights, *self.moments, *grads, self.decay, lr, beta1, beta2, eps,
                               self.beta1_power, self.beta2_power, factor, finite, self.global_step)
        return self.kernel(*self.weights, *self.moments, *grads, self.decay, lr, self.momentum, factor, finite,
                           self.global_step)


def fused_optimizer_update(optimizer: nn.Optimizer) -> Optional[FusedOptimizerUpdate]:
    """The fused update for `optimizer`, or None: where trainkit's kernels do not build (``kernels.describe``),
    or `optimizer` is not an ``nn.Momentum``, ``nn.Adam`` or ``nn.AdamWeightDecay`` over ungrouped float32
    parameters with a fixed weight decay and no loss scale of its own."""
    entry_point = _entry_point(optimizer)
    if entry_point is None:
        return None
    kernel = kernels.optimizer_update_kernel(entry_point)
    return None if kernel is None else FusedOptimizerUpdate(optimizer, entry_point, kernel)


def fused_step_kernels(wrapper: nn.Cell, base: type) -> Tuple[Optional[FusedOptimizerUpdate], Optional[object]]:
    """``(fused optimizer update, statistics restore kernel)`` for a ``TrainingWrapper`` being built, or None for
    either where MindSpore's optimizer behind the guard's branch must run instead: the kernels do not build, the
    optimizer is not one they repeat, the EMA or the moving statistics are not all float32, or a subclass of `base`
    overrides a phase the one call stands for (``apply_grads``, ``restore_moving_statistics``, ``unscale_grads``,
    ``transform_grads``, ``unscale_and_transform``)."""
    overridden = any(getattr(type(wrapper), name) is not getattr(base, name)
                     for name in ("apply_grads", "restore_moving_statistics", "unscale_grads", "transform_grads",
                                  "unscale_and_transform"))
    if overridden or (wrapper.ema is not None and wrapper.ema.fused_all_if is None):
        return None, None
    restore = None
    if wrapper.guard_moving_statistics:
        if any(statistic.dtype != mstype.float32 for statistic in wrapper.moving_statistics):
            return None, None
        restore = kernels.restore_all_unless_kernel()
    update = fused_optimizer_update(wrapper.optimizer)
    return (update, restore) if update is not None else (None, None)


def statistics_restore_kernel(wrapper: nn.Cell, base: type) -> Optional[object]:
    """``kernels.restore_all_unless_kernel()`` for a ``TrainingWrapper`` being built whose step keeps MindSpore's
    optimizer behind the guard's branch: its moving statistics are then still saved (an accumulation window's
    ``_window_start``) and put back by one kernel call each way, with a flag and no branch of their own, as the fused
    step's are. None without guarded statistics, where one is not float32, where a subclass of `base` overrides
    ``save_moving_statistics`` or ``restore_moving_statistics`` (its own pair keeps the branch), or where the kernels
    do not build."""
    overridden = any(getattr(type(wrapper), name) is not getattr(base, name)
                     for name in ("save_moving_statistics", "restore_moving_statistics"))
    if (overridden or not wrapper.guard_moving_statistics
            or any(statistic.dtype != mstype.float32 for statistic in wrapper.moving_statistics)):
        return None
    return kernels.restore_all_unless_kernel()


def flat_statistics_kernels(wrapper: nn.Cell, base: type) -> Tuple[Optional[object], Optional[object]]:
    """``(copy kernel, restore kernel)`` for a ``TrainingWrapper`` being built whose step restores the moving
    statistics by a kernel (``wrapper.restore_statistics_unless``: the fused step's, or
    :func:`statistics_restore_kernel`'s): they are saved as one flat copy (``kernels.concat_all_kernel``) and put
    back from it, one kernel call each way instead of a multiply per tensor (ResNet-50: 106 statistics); the same
    values. (None, None) without that kernel, with accumulation (its ``_window_start`` Parameters hold the copy, so
    that a checkpoint taken inside a window has it), where a subclass of `base` overrides
    ``save_moving_statistics``, or where the kernels do not build."""
    if (wrapper.restore_statistics_unless is None or wrapper.accumulation_steps != 1
            or type(wrapper).save_moving_statistics is not base.save_moving_statistics):
        return None, None
    concat, restore = kernels.concat_all_kernel(), kernels.restore_flat_unless_kernel()
    return (concat, restore) if concat is not None and restore is not None else (None, None)
