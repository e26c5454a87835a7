"""Dropout whose random stream a checkpoint holds, so a resumed run draws the masks the uninterrupted one would.

MindSpore 2.10's ``nn.Dropout`` on CPU keeps its position in the random stream inside the kernel, where nothing
can read or set it (and ``mint.nn.Dropout``, which draws from ``mindspore.Generator``, has no CPU kernel), so a
resume restarts its masks. This layer draws each mask from a counter-based hash of (seed, layer, call, element):
the call counter is a Parameter of the layer, saved in every training checkpoint with the rest of the state, and
the hash is ``lowbias32`` (Chris Wellons' integer hash; two multiply-xorshift rounds on uint32), which MindSpore
runs with its own CPU kernels (RightShift, BitwiseXor, Mul wrapping modulo 2**32).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from trainkit.checks import check_number

_GOLDEN = 0x9E3779B9
_next_stream = [0]  # the stream of the next layer built without one


@contextlib.contextmanager
def streams_from_zero() -> Iterator[None]:
    """Number the streams of the layers built inside from 0, in the order they are built: the same model built
    again (a resumed run, in a new process or in this one) gets the same streams. The app builds models inside."""
    saved, _next_stream[0] = _next_stream[0], 0
    try:
        yield
    finally:
        _next_stream[0] = saved


class _CounterRandom(nn.Cell):
    """A random layer whose draws are a hash of (seed, rank, stream, call, index): nothing kept in a kernel."""

    def __init__(self, p: float, stream: Optional[int]):
        super().__init__()
        self.p = float(check_number("p", p, "a number in [0, 1)", lambda v: 0 <= v < 1))
        if stream is None:
            stream, _next_stream[0] = _next_stream[0], _next_stream[0] + 1
        self.stream = int(stream)
        seed = ms.get_seed() or 0
        rank = np.uint32(_rank() * 0x85EBCA6B % 2 ** 32)
        salt = _lowbias32(np.uint32((seed * _GOLDEN + self.stream) % 2 ** 32) ^ rank)
        self.salt = Tensor(np.uint32(salt), ms.uint32)
        self.calls = Parameter(Tensor(0, ms.int32), name="dropout_calls", requires_grad=False)
        self.scale = 1.0 / (1.0 - self.p)
        self.threshold = Tensor(np.uint32(min(int(self.p * 2 ** 32), 2 ** 32 - 1)), ms.uint32)
        self.shift = ops.RightShift()

    def _keep(self, count: int):
        """`count` booleans, each True with probability 1 - p, for this call; the call counter moves on."""
        call = self.calls.astype(ms.uint32) * Tensor(_GOLDEN, ms.uint32)
        stream = self._hash(ops.bitwise_xor(call, self.salt))
        index = ops.arange(0, count, dtype=ms.int32).astype(ms.uint32)
        draws = self._hash(index + stream)
        ops.assign_add(self.calls, ops.ones((), ms.int32))
        return draws >= self.threshold

    def _hash(self, x):
        x = ops.bitwise_xor(x, self.shift(x, ops.full_like(x, 16)))
        x = x * Tensor(0x7FEB352D, ms.uint32)
        x = ops.bitwise_xor(x, self.shift(x, ops.full_like(x, 15)))
        x = x * Tensor(0x846CA68B, ms.uint32)
        return ops.bitwise_xor(x, self.shift(x, ops.full_like(x, 16)))

    def extend_repr(self) -> str:
        return f"p={self.p}"


class Dropout(_CounterRandom):
    """Zeroes each element with probability `p` in training (the rest scaled by 1 / (1 - p)); the identity in
    evaluation. The masks depend on MindSpore's global seed (``trainer.seed``), the layer's `stream`, and ``calls``
    (the training forward passes so far, a Parameter a checkpoint keeps).

    Args:
        p: the probability of zeroing an element, in [0, 1).
        stream: which random stream the layer draws from; None: the next one (0 for the first layer built inside
            :func:`streams_from_zero`, as the app builds models, then 1, 2, ...).
    """

    def __init__(self, p: float = 0.5, stream: Optional[int] = None):
        super().__init__(p, stream)

    def construct(self, x):
        if not self.training or self.p == 0:
            return x
        keep = self._keep(x.size).reshape(x.shape)
        return ops.select(keep, x * self.scale, ops.zeros_like(x))


class DropPath(_CounterRandom):
    """Stochastic depth (torchvision's ``StochasticDepth``, timm's ``DropPath``): in training, each sample's
    whole tensor is zeroed with probability `p` (``per_sample``; else the whole batch at once) and the kept ones
    scaled by 1 / (1 - p) where `scale` (PyTorch's arithmetic); the identity in evaluation. Its draws resume
    exactly, as :class:`Dropout`'s do.

    Args:
        p: the probability of dropping a sample's path, in [0, 1).
        per_sample: one draw per sample (torchvision's mode ``row``, timm's) or one per batch (mode ``batch``).
        scale: divide the kept paths by 1 - p (timm's ``scale_by_keep``; torchvision always does).
        stream: as :class:`Dropout`'s.
    """

    def __init__(self, p: float = 0.0, per_sample: bool = True, scale: bool = True, stream: Optional[int] = None):
        super().__init__(p, stream)
        self.per_sample = bool(per_sample)
        if not scale:
            self.scale = 1.0

    def construct(self, x):
        if not self.training or self.p == 0:
            return x
        shape = (x.shape[0] if self.per_sample else 1,) + (1,) * (x.ndim - 1)
        keep = self._keep(shape[0]).reshape(shape)
        return ops.select(ops.broadcast_to(keep, x.shape), x * self.scale, ops.zeros_like(x))

    def extend_repr(self) -> str:
        return f"p={self.p}, per_sample={self.per_sample}, scale={self.scale != 1.0}"


def _rank() -> int:
    """This process's rank in a data-parallel job (0 alone): each rank's shard gets masks of its own."""
    from mindspore.communication import GlobalComm, get_rank

    return int(get_rank()) if GlobalComm.INITED else 0


def _lowbias32(value: np.uint32) -> int:
    with np.errstate(over="ignore"):
        x = np.uint32(value)
        x ^= x >> np.uint32(16)
        x = np.uint32(x * np.uint32(0x7FEB352D))
        x ^= x >> np.uint32(15)
        x = np.uint32(x * np.uint32(0x846CA68B))
        x ^= x >> np.uint32(16)
    return int(x)
