"""Writing a value into the memory a Parameter holds, where graphs compiled over it read it."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops


def assign_in_place(parameter: Parameter, value: np.ndarray) -> None:
    """Write `value` into the memory `parameter` holds now, where compiled graphs read it.

    ``Parameter.set_data`` gives the Parameter new memory: a graph compiled before goes on reading the old memory
    where the train step's control flow (the non-finite guard's branch: optimizer step, EMA) uses it, so a run
    after a ``set_data`` trained with a frozen EMA and an optimizer step that did not restart (measured). On CPU
    the Parameter's NumPy view is that memory (no operator dispatched, which ``ops.assign`` costs ~1.4 ms a call);
    elsewhere ``ops.assign`` writes it."""
    if ms.get_context("device_target") == "CPU":
        view = parameter.asnumpy()
        if (view.flags.writeable and not view.flags.owndata and view.shape == value.shape
                and view.dtype == value.dtype):
            np.copyto(view, value, casting="no")
            return
    ops.assign(parameter, Tensor(value, dtype=parameter.dtype))
