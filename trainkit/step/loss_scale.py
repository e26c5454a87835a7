"""Loss-scale argument handling: turn what users pass into a `mindspore.amp` scaler."""
from __future__ import annotations

import math
from numbers import Real
from typing import Optional, Union

from mindspore import amp, ops

LossScaler = Union[amp.StaticLossScaler, amp.DynamicLossScaler]
LossScaleArg = Union[None, float, int, amp.StaticLossScaler, amp.DynamicLossScaler]


def make_loss_scaler(loss_scale: LossScaleArg) -> Optional[LossScaler]:
    """Return the scaler for ``loss_scale``, or None when scaling is off.

    Args:
        loss_scale: None (no scaling), a number >= 1 (a static scale) or a
            ``mindspore.amp.StaticLossScaler`` / ``DynamicLossScaler`` instance.

    Raises:
        TypeError: for any other type.
        ValueError: for a number that is not finite or below 1 (MindSpore's scalers require >= 1).
    """
    if loss_scale is None:
        return None
    if isinstance(loss_scale, (amp.StaticLossScaler, amp.DynamicLossScaler)):
        return loss_scale
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, Real):
        raise TypeError(
            "loss_scale must be None, a number >= 1, or a mindspore.amp.StaticLossScaler or "
            f"DynamicLossScaler instance; got {type(loss_scale).__name__}: {loss_scale!r}"
        )
    if not math.isfinite(loss_scale) or loss_scale < 1:
        raise ValueError(f"loss_scale must be a finite number >= 1; got {loss_scale!r}")
    return amp.StaticLossScaler(float(loss_scale))


def next_dynamic_scale(scale, counter, grads_finite, scale_factor: int, scale_window: int):
    """The rule of ``mindspore.amp.DynamicLossScaler.adjust``, on Parameters a Cell owns.

    Finite: count one more good step; after ``scale_window`` of them multiply the scale by
    ``scale_factor`` (if the product is finite) and restart the count. Not finite: divide
    by ``scale_factor`` (never below 1) and restart the count.

    The wrapper calls this rather than the scaler's own method: in graph mode a method of a
    plain Python object that reads its Parameters was seen to compile, now and then, with
    the Parameter's initial value frozen in as a constant.

    Returns:
        (new scale, new counter).
    """
    grown = scale * scale_factor
    new_scale = ops.select(
        grads_finite,
        ops.select(counter == scale_window - 1, ops.select(ops.isfinite(grown), grown, scale), scale),
        ops.maximum(ops.ones_like(scale), scale / scale_factor),
    )
    new_counter = ((counter + 1) % scale_window) * grads_finite.astype(counter.dtype)
    return new_scale, new_counter
