"""Which kernels a run's fused passes took, kept in its checkpoints: a resume on the other path is not bitwise.

The wrapper's optimizer update (nn.Momentum, nn.Adam, nn.AdamWeightDecay), gradient norm (clipping, its logging,
the guard's check), EMA update, gradient accumulation and the unfolded convolutions' im2col run trainkit's C++
kernels where they build (:mod:`trainkit.kernels`), else MindSpore's own. The EMA, accumulation and nn.Momentum
passes round alike on both paths; Adam's does not (MindSpore's SIMD kernel differs from float32 operation by
operation in the last bit of a few values a step), nor does the norm (the kernel sums the squares in double), nor
do the convolutions: measured on the quick start, one epoch with the kernels and one with
``TRAINKIT_FUSED_KERNELS=off`` end with 56 of 70 tensors apart, by up to 8.6e-7 (batch-norm statistics first).
So a checkpoint records its path (``kernel_path``: ``fused`` or ``mindspore``, when the run takes a fused pass at
all), and a resume on the other path is refused unless ``trainer.resume_kernels=any``.
"""
from __future__ import annotations

import logging
from typing import Any, List, Optional

from mindspore import nn

from trainkit.errors import ConfigError
from trainkit.kernels import describe, library
from trainkit.models.conv import UnfoldConv2d
from trainkit.step.fused_optimizer import repeats

log = logging.getLogger("trainkit")

ENTRY = "kernel_path"  # the checkpoint's entry


def fused_passes(wrapper: nn.Cell) -> List[str]:
    """The passes of `wrapper` (a TrainingWrapper) that run trainkit's kernels where they build."""
    im2col = any(isinstance(cell, UnfoldConv2d) and not cell.identity_columns for _, cell in wrapper.cells_and_names())
    optimizer = getattr(wrapper, "optimizer", None)
    return [name for name, on in (("optimizer update", optimizer is not None and repeats(optimizer)),
                                  ("gradient norm", getattr(wrapper, "fusable_norm", False)),
                                  ("EMA update", getattr(wrapper, "ema", None) is not None),
                                  ("gradient accumulation", getattr(wrapper, "accumulation_steps", 1) > 1),
                                  ("convolutions' im2col", im2col)) if on]


def kernel_path(wrapper: nn.Cell) -> Optional[str]:
    """``fused`` or ``mindspore``: the path `wrapper`'s fused passes take in this process; None without any."""
    if not fused_passes(wrapper):
        return None
    return "fused" if library()[0] is not None else "mindspore"


def check_same_kernels(recorded: Optional[str], wrapper: nn.Cell, resume_kernels: Any, where: str) -> None:
    """Raise ConfigError when the checkpoint at `where` took another kernel path than this run would (unless
    `resume_kernels` is ``any``: then a warning). A checkpoint without the entry (no fused pass, or older) passes."""
    now = kernel_path(wrapper)
    if recorded is None or now is None or recorded == now:
        return
    written = "trainkit's fused C++ kernels" if recorded == "fused" else "MindSpore's kernels"
    problem = (f"{where} was written with {written} for its {' and '.join(fused_passes(wrapper))}, and this run "
               f"would take {describe()}: the two paths round differently (by about 1e-7), so the continuation would "
               "not be bitwise the run that never stopped")
    if str(getattr(resume_kernels, "value", resume_kernels)) == "any":
        log.warning("%s; continuing as trainer.resume_kernels=any asks", problem)
        return
    same = ("a C++ compiler on PATH, TRAINKIT_FUSED_KERNELS unset" if recorded == "fused"
            else "TRAINKIT_FUSED_KERNELS=off")
    raise ConfigError(f"{problem}: resume where the same kernels run ({same}), or accept the difference with "
                      "trainer.resume_kernels=any")

