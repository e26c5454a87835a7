"""Max pooling on trainkit's C++ kernel: MindSpore 2.10's CPU `nn.MaxPool2d` is slow at small sizes.

`nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)` runs `MaxPool3DWithArgmax`, which took 4 ms on ResNet-18's
(32, 64, 16, 16) stem output, ~5 % of its training step at 32x32 (PyTorch's max_pool2d: 2 ms with its backward).
`KernelMaxPool2d` is an `nn.MaxPool2d` subclass that only replaces `construct` with `trainkit.kernels`'
max pooling: the same values (torch's, with -inf padding and NaN propagating) and the gradient to each window's
first maximum. It pools each (H, W) plane on its own, so it takes (N, C, H, W) and channel-major (C, N, H, W)
activations alike.
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from trainkit.kernels import geometry_values, max_pool_kernel

__all__ = ["KernelMaxPool2d", "max_pool_geometry"]

Geometry = Tuple[int, int, int, int, int, int, int, int]


def max_pool_geometry(pool: nn.MaxPool2d) -> Optional[Geometry]:
    """(kh, kw, sh, sw, ph, pw, dh, dw) of `pool` where `KernelMaxPool2d` computes what it does, else None: NHWC,
    `return_indices`, `ceil_mode`, `pad_mode="same"`, or padding above half the kernel (torch refuses that too)."""
    if pool.format != "NCHW" or pool.return_indices:
        return None
    attributes = pool.max_pool.attrs
    if pool.use_pad:  # pad_mode="pad": MaxPool3DWithArgmax over (N, C, 1, H, W)
        if attributes["ceil_mode"]:
            return None
        (kh, kw), (sh, sw) = attributes["ksize"][1:], attributes["strides"][1:]
        (ph, pw), (dh, dw) = attributes["pads"][1:], attributes["dilation"][1:]
    elif attributes["pad_mode"] == "VALID":
        (kh, kw), (sh, sw) = attributes["kernel_size"][2:], attributes["strides"][2:]
        (ph, pw), (dh, dw) = (0, 0), (1, 1)
    else:
        return None
    if 2 * ph > kh or 2 * pw > kw:
        return None
    return tuple(int(value) for value in (kh, kw, sh, sw, ph, pw, dh, dw))


class KernelMaxPool2d(nn.MaxPool2d):
    """`nn.MaxPool2d(kernel_size, stride, pad_mode="pad", padding, dilation)` computed by trainkit's kernel.

    Args:
        geometry: (kh, kw, sh, sw, ph, pw, dh, dw), symmetric padding counted as -inf (see `max_pool_geometry`).

    Raises:
        ValueError: trainkit's kernels do not build here (`trainkit.kernels.library` says why).
    """

    def __init__(self, geometry: Geometry):
        kh, kw, sh, sw, ph, pw, dh, dw = geometry
        super().__init__(kernel_size=(kh, kw), stride=(sh, sw), pad_mode="pad", padding=(ph, pw), dilation=(dh, dw))
        self.kernel = max_pool_kernel(geometry)
        if self.kernel is None:
            from trainkit.kernels import library

            raise ValueError(f"KernelMaxPool2d needs trainkit's C++ kernels, which cannot run here ({library()[1]})")
        self.geometry = Tensor(np.array(geometry_values(geometry), np.int64))

    def construct(self, x):
        if x.ndim == 3:  # (C, H, W), as nn.MaxPool2d takes
            return self._pooled(x.expand_dims(0)).squeeze(0)
        return self._pooled(x)

    def _pooled(self, x):
        if x.dtype == ms.float32:
            return self.kernel(x, self.geometry)[0]
        return self.kernel(x.astype(ms.float32), self.geometry)[0].astype(x.dtype)  # the kernel is float32 only
