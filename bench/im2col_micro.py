"""Per-op timing of im2col on CPU: MindSpore's `ops.unfold` (+ transpose) against pad + 9 slices + stack.

Run `python -m bench.im2col_micro`; it prints both forward and forward+backward times, alternating in one
process, with the load average, for two ResNet-50 3x3 shapes at 32x32 input and batch 32, and checks that both
give the same columns. Measured to choose the next lever for row 6 (docs/performance.md, convolutions); not a
bench row.
"""
import os
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops


def _time(fn, *args, reps: int = 5) -> float:
    fn(*args).asnumpy()
    start = time.perf_counter()
    for _ in range(reps):
        fn(*args).asnumpy()
    return (time.perf_counter() - start) / reps * 1e3


def slices(x):
    """Columns (C*9, N*H*W), channel-major then kernel offset, from a padded input's 9 shifted views."""
    n, c, h, w = x.shape
    xp = ops.pad(x, (1, 1, 1, 1)).transpose(1, 0, 2, 3)
    parts = [xp[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)]
    return ops.stack(parts, 1).reshape(c * 9, -1)


def unfold(x):
    """The same columns as UnfoldConv2d builds them today."""
    return ops.unfold(x, 3, 1, 1, 1).transpose(1, 0, 2).reshape(x.shape[1] * 9, -1)


def main() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    for channels, size in [(64, 8), (128, 4)]:
        x = Tensor(np.random.rand(32, channels, size, size).astype(np.float32))
        same = np.array_equal(unfold(x).asnumpy(), slices(x).asnumpy())
        grad_unfold = ms.grad(lambda t: unfold(t).sum())
        grad_slices = ms.grad(lambda t: slices(t).sum())
        for _ in range(2):
            print(f"c={channels} hw={size} same={same} unfold fwd {_time(unfold, x):.1f} fwd+bwd "
                  f"{_time(grad_unfold, x):.1f} | slices fwd {_time(slices, x):.1f} fwd+bwd "
                  f"{_time(grad_slices, x):.1f} ms  load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
