"""A graph-mode Cell that runs op by op (PyNative) for an input shape it has not compiled, while the shape is rare.

MindSpore compiles a Cell's graph once per input shape. The test set is evaluated once, at the end of a run, and
when its batches have another shape than the validation set's (the digits' test split is one batch of 359
against the validation set's 179) that single forward pass compiled the evaluation graph a second time: on this
2-core CPU 0.31 s of compiling for a pass that takes 0.03 s op by op (the quick start's network), 0.33 s for
0.01 s (digits_lstm). A graph and the same Cell run op by op call the same CPU kernels; their outputs were
bitwise equal on the small CNN, the LSTM and ResNet-18 in float32 (tests/step/test_rare_shapes.py; ResNet-50
in a probe). Not so in half precision: MindSpore 2.10 casts the inputs of every operator of a
``to_float(float16)`` Cell op by op, but only the Cell's inputs in a graph, so an AMP network's figures would
differ (trainkit's float32-only C++ kernels then read half-precision memory). A Cell says whether it may run op
by op (``op_by_op_allowed``); the evaluation network allows it only for a float32 network without AMP.

Op by op is slower per call (ResNet-50 at 32x32, 32 images: 0.40 s against 0.06 s; its compile 2.5 s), so a
shape runs op by op only for its first ``calls`` calls inside :meth:`OpByOpForNewShapes.new_shapes_op_by_op`;
the next call of that shape compiles it as before. Outside that block nothing changes.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Any, Dict, Hashable, Iterator, Tuple

import mindspore as ms
from mindspore import Tensor

__all__ = ["OpByOpForNewShapes", "shape_key"]


def shape_key(args: Tuple[Any, ...]) -> Hashable:
    """What a graph is compiled for: each Tensor argument's shape and dtype (other arguments by value)."""
    return tuple((tuple(a.shape), str(a.dtype)) if isinstance(a, Tensor) else repr(a) for a in args)


class OpByOpForNewShapes:
    """Mixin for an ``nn.Cell`` (put it first among the bases): remembers the input shapes it ran as a graph, and
    inside :meth:`new_shapes_op_by_op` runs a shape it has not compiled op by op, for that shape's first `calls`
    calls. The context's mode is back to graph mode after each such call, also when it raises."""

    def _shapes_state(self) -> Dict[str, Any]:
        # Kept in the instance's __dict__ under one name: a Cell's __setattr__ treats some values specially, and
        # the state must exist whichever base __init__ ran first.
        state = self.__dict__.get("_op_by_op_shapes")
        if state is None:
            state = {"compiled": set(), "calls": None, "limit": 0, "allowed": True}
            self.__dict__["_op_by_op_shapes"] = state
        return state

    @property
    def op_by_op_allowed(self) -> bool:
        """Whether :meth:`new_shapes_op_by_op` may run this Cell op by op (set it False where the figures could
        differ from the compiled graph's)."""
        return self._shapes_state()["allowed"]

    @op_by_op_allowed.setter
    def op_by_op_allowed(self, allowed: bool) -> None:
        self._shapes_state()["allowed"] = bool(allowed)

    @contextlib.contextmanager
    def new_shapes_op_by_op(self, calls: int = 2) -> Iterator[None]:
        """Inside the block, an input shape this Cell has not run as a graph runs op by op for its first `calls`
        calls (counted inside this block), and is compiled from the call after."""
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(f"calls must be an int >= 0; got {calls!r}")
        state = self._shapes_state()
        previous = state["calls"], state["limit"]
        state["calls"], state["limit"] = collections.Counter(), calls
        try:
            yield
        finally:
            state["calls"], state["limit"] = previous

    def __call__(self, *args, **kwargs):
        if ms.get_context("mode") != ms.GRAPH_MODE:
            return super().__call__(*args, **kwargs)
        state = self._shapes_state()
        key = shape_key(args)
        counts = state["calls"]
        if counts is not None and state["allowed"] and key not in state["compiled"] and counts[key] < state["limit"]:
            counts[key] += 1
            ms.set_context(mode=ms.PYNATIVE_MODE)
            try:
                return super().__call__(*args, **kwargs)
            finally:
                ms.set_context(mode=ms.GRAPH_MODE)
        state["compiled"].add(key)
        return super().__call__(*args, **kwargs)
