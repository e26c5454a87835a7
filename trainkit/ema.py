"""Exponential moving average of a network's weights and batch-norm statistics."""
from __future__ import annotations

from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import dtype as mstype

_ema_update = ops.MultitypeFuncGraph("ema_update")


@_ema_update.register("Tensor", "Tensor", "Tensor")
def _update_shadow(decay, shadow, value):
    return ops.assign(shadow, shadow * decay.astype(shadow.dtype) + value * (1 - decay).astype(shadow.dtype))


def ema_source_parameters(network: nn.Cell) -> list:
    """The parameters an EMA follows: every floating-point parameter of `network`.

    Trainable weights and batch-norm moving statistics alike (as timm's ModelEmaV2
    covers buffers); integer counters are left out.
    """
    return [p for p in network.get_parameters() if p.dtype in (mstype.float16, mstype.float32, mstype.float64,
                                                              mstype.bfloat16)]


class ExponentialMovingAverage(nn.Cell):
    """Shadow copies ``ema.<name>`` updated as ``ema = decay * ema + (1 - decay) * value``.

    Args:
        parameters: the parameters to follow.
        decay: in [0, 1).
        warmup: when True, use ``min(decay, (1 + n) / (10 + n))`` for the n-th update
            (n counted from 0), so early shadows are not dominated by the initial weights.
    """

    def __init__(self, parameters, decay: float, warmup: bool = False):
        super().__init__(auto_prefix=False)
        self.sources = ParameterTuple(parameters)
        self.shadows = ParameterTuple(
            Parameter(p.data.copy(), name="ema." + p.name, requires_grad=False) for p in parameters
        )
        # The number of updates applied so far: resume needs it for the warm-up.
        self.num_updates = Parameter(Tensor(0, mstype.int32), name="ema_num_updates", requires_grad=False)
        self.decay = Tensor(decay, mstype.float32)
        self.warmup = warmup
        self.hyper_map = ops.HyperMap()

    def current_decay(self) -> Tensor:
        """The decay the next update will use."""
        if self.warmup:
            count = self.num_updates.astype(mstype.float32)
            return ops.minimum(self.decay, (1.0 + count) / (10.0 + count))
        return self.decay

    def construct(self):
        decay = self.current_decay()
        updated = self.hyper_map(ops.partial(_ema_update, decay), self.shadows, self.sources)
        return ops.depend(ops.assign_add(self.num_updates, ops.ones((), mstype.int32)), updated)

    def shadow_weights(self) -> dict:
        """``{original name: shadow value}``, ready for ``mindspore.load_param_into_net``."""
        return {source.name: Parameter(shadow.data.copy(), name=source.name)
                for source, shadow in zip(self.sources, self.shadows)}
