"""Exponential moving average of a network's weights and batch-norm statistics."""
from __future__ import annotations

from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import dtype as mstype

from trainkit import kernels

_ema_update = ops.MultitypeFuncGraph("ema_update")
_ema_update_fused = ops.MultitypeFuncGraph("ema_update_fused")
_FUSED_KERNEL = None  # kernels.ema_update_kernel(), set by the first EMA that has one (read by the graph below)


@_ema_update.register("Tensor", "Tensor", "Tensor")
def _update_shadow(weight, shadow, value):
    """``shadow -= (shadow - value) * (1 - decay)``: one subtract, one multiply, one in-place subtract.

    Equal to ``decay * shadow + (1 - decay) * value`` within float32 rounding, with one kernel and one
    temporary fewer per tensor (results/developers-history.md, "Performance notes", has the variants measured).
    """
    return ops.assign_sub(shadow, (shadow - value) * weight.astype(shadow.dtype))


@_ema_update_fused.register("Tensor", "Tensor", "Tensor")
def _update_shadow_fused(weight, shadow, value):
    """The same update in one multithreaded pass of trainkit's C++ kernel (float32; other dtypes as above)."""
    if shadow.dtype == mstype.float32 and value.dtype == mstype.float32:
        return _FUSED_KERNEL(shadow, value, weight.astype(mstype.float32))
    return ops.assign_sub(shadow, (shadow - value) * weight.astype(shadow.dtype))


def ema_source_parameters(network: nn.Cell) -> list:
    """The parameters an EMA follows: every floating-point parameter of `network`.

    Trainable weights and batch-norm moving statistics alike (as timm's ModelEmaV2
    covers buffers); integer counters are left out.
    """
    return [p for p in network.get_parameters() if p.dtype in (mstype.float16, mstype.float32, mstype.float64,
                                                              mstype.bfloat16)]


class ExponentialMovingAverage(nn.Cell):
    """Shadow copies ``ema.<name>`` updated as ``ema = decay * ema + (1 - decay) * value``.

    With ``every=N > 1`` a call counts an applied step and only every N-th call updates, with
    ``decay ** N``: after N steps a weight's old value keeps the same share ``decay ** N`` as with
    updates every step, but the shadow follows the weights' value at every N-th step instead of
    averaging each step's (Lightning's ``EMAWeightAveraging(update_every_n_steps=N)`` offers the same).

    Args:
        parameters: the parameters to follow.
        decay: in [0, 1).
        warmup: when True, use ``min(decay, (1 + n) / (10 + n))`` for the n-th update
            (n counted from 0), so early shadows are not dominated by the initial weights
            (raised to the power N with ``every=N``).
        every: update on every `every`-th call (>= 1). The calls since the last update are the
            Parameter ``ema_step`` (saved with the checkpoint, so a resume continues the cycle).
    """

    def __init__(self, parameters, decay: float, warmup: bool = False, every: int = 1):
        super().__init__(auto_prefix=False)
        self.sources = ParameterTuple(parameters)
        # ``ema.<name>``; clone(init="same") copies each value once (``Parameter(p.data.copy())`` held ~1.9
        # copies of the parameters after construction, measured with bench/memory.py's probe).
        self.shadows = self.sources.clone(prefix="ema", init="same")
        for shadow in self.shadows:
            shadow.requires_grad = False
        # The number of updates applied so far: resume needs it for the warm-up.
        self.num_updates = Parameter(Tensor(0, mstype.int32), name="ema_num_updates", requires_grad=False)
        self.decay = Tensor(decay, mstype.float32)
        self.every = int(every)
        # decay ** every computed in double precision once, then stored as float32.
        self.weight = Tensor(1.0 - float(decay) ** self.every, mstype.float32)
        self.warmup = warmup
        if self.every > 1:
            self.step = Parameter(Tensor(0, mstype.int32), name="ema_step", requires_grad=False)
        self.hyper_map = ops.HyperMap()
        # One pass of a C++ kernel per shadow instead of MindSpore's three (trainkit/kernels/), where it builds.
        self.fused_kernel = kernels.ema_update_kernel()
        if self.fused_kernel is not None:
            global _FUSED_KERNEL
            _FUSED_KERNEL = self.fused_kernel
        # With every shadow float32 (no mixed dtypes), one call of the kernel for all of them: fewer launches and
        # one set of threads for the whole update (ResNet-50: 5.0 against 12.8 ms for one call per tensor).
        all_float32 = len(self.sources) > 0 and all(p.dtype == mstype.float32 for p in self.sources)
        self.fused_all = kernels.ema_update_all_kernel() if all_float32 else None
        # The same with a flag, for a wrapper whose optimizer step takes the finite flag (no branch in the graph).
        self.fused_all_if = kernels.ema_update_all_if_kernel() if all_float32 else None

    def current_decay(self) -> Tensor:
        """The decay of one step the next update will use (before raising it to the power `every`)."""
        if self.warmup:
            count = self.num_updates.astype(mstype.float32)
            return ops.minimum(self.decay, (1.0 + count) / (10.0 + count))
        return self.decay

    def current_weight(self) -> Tensor:
        """``1 - current_decay() ** every``: the share of the live value in the next update."""
        if not self.warmup:
            return self.weight
        if self.every == 1:
            return 1.0 - self.current_decay()
        return 1.0 - ops.pow(self.current_decay(), self.every)

    def update(self):
        """Move every shadow towards its source now and count the update."""
        if self.fused_all is not None:
            updated = self.fused_all(*self.shadows, *self.sources, self.current_weight())
        else:
            update = _ema_update_fused if self.fused_kernel is not None else _ema_update
            updated = self.hyper_map(ops.partial(update, self.current_weight()), self.shadows, self.sources)
        return ops.depend(ops.assign_add(self.num_updates, ops.ones((), mstype.int32)), updated)

    def construct(self):
        if self.every == 1:
            return self.update()
        step = self.step * 1  # read before the assign below
        ops.assign(self.step, (step + 1) % self.every)
        due = step == self.every - 1
        if due:
            self.update()
        return due

    def update_if(self, applied: Tensor):
        """``construct`` on a step whose optimizer update was `applied` (a bool scalar); nothing at all otherwise,
        with no branch in the graph: the shadows, ``ema_num_updates`` and ``ema_step`` stay. Needs
        ``fused_all_if`` (every shadow float32, trainkit's kernels built)."""
        due = applied
        if self.every > 1:
            step = self.step * 1  # read before the assign below
            ops.assign(self.step, ops.select(applied, (step + 1) % self.every, step))
            due = ops.logical_and(applied, step == self.every - 1)
        updated = self.fused_all_if(*self.shadows, *self.sources, self.current_weight(), due)
        return ops.depend(ops.assign_add(self.num_updates, due.astype(mstype.int32)), updated)

    def shadow_weights(self) -> dict:
        """``{original name: shadow value}``, ready for ``mindspore.load_param_into_net``."""
        return {source.name: Parameter(shadow.data.copy(), name=source.name)
                for source, shadow in zip(self.sources, self.shadows)}
