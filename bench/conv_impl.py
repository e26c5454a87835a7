"""Rows 6 and 9: trainkit's ResNet-50 train step with each convolution implementation, and PyTorch eager."""
from __future__ import annotations

import importlib.util
import os
from typing import List

import mindspore as ms
from mindspore import nn

from bench.common import (
    Row,
    Settings,
    Stepper,
    alternate,
    batch_tensors,
    loss_network,
    median_ms,
    ratio,
    setup,
    threads,
)
from trainkit import TrainingWrapper
from trainkit.models import resnet50
from trainkit.models.conv import resolve_conv_impl


def _step(conv_impl: str, settings: Settings, im2col_kernel: bool = True) -> Stepper:
    """ResNet-50's train step; `im2col_kernel=False` builds its convolutions' columns with ops.unfold instead of
    trainkit's C++ kernel (the path taken where no compiler is)."""
    ms.set_seed(0)
    previous = os.environ.get("TRAINKIT_FUSED_KERNELS")
    if not im2col_kernel:
        os.environ["TRAINKIT_FUSED_KERNELS"] = "0"
    try:
        backbone = resnet50(num_classes=10, conv_impl=conv_impl)
    finally:
        if previous is None:
            os.environ.pop("TRAINKIT_FUSED_KERNELS", None)
        else:
            os.environ["TRAINKIT_FUSED_KERNELS"] = previous
    optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)
    cell = TrainingWrapper(loss_network(backbone), optimizer)
    return Stepper(cell, batch_tensors(settings.batch, 3, settings.image), settings.warmup)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def run(settings: Settings) -> List[Row]:
    auto = resolve_conv_impl("auto")
    where = setup("resnet50", settings.batch, settings.image, conv_impl_auto=auto, reps=settings.reps)
    sides = {"auto": _step("auto", settings).run(settings.large_steps)}
    per_step = {"auto": settings.large_steps}
    im2col = auto == "channel_major"
    if im2col:
        sides["ops.unfold"] = _step("unfold", settings, im2col_kernel=False).run(settings.large_steps)
        per_step["ops.unfold"] = settings.large_steps
    eager = None
    if torch_available():
        from bench.torch_resnet import EagerStep
        eager = EagerStep(settings.batch, settings.image, threads())
        for _ in range(1 + settings.warmup):
            eager.step()
        sides["torch"] = lambda: [eager.step() for _ in range(settings.large_steps)]
        per_step["torch"] = settings.large_steps
    seconds = alternate(sides, settings.reps)
    # MindSpore's own kernel is so slow on CPU that it gets its own, shorter, alternation against auto.
    native_sides = {"auto": sides["auto"], "native": _step("native", settings).run(settings.native_steps)}
    native_seconds = alternate(native_sides, max(2, settings.reps // 2))
    native_seconds["auto"] = [s / settings.large_steps for s in native_seconds["auto"]]
    native_seconds["native"] = [s / settings.native_steps for s in native_seconds["native"]]
    times = (f"auto ({auto}) {median_ms(seconds['auto'], settings.large_steps)}/step, native "
             f"{median_ms(native_seconds['native'])}/step")
    rows = []
    if im2col:
        value, spread = ratio(seconds, "ops.unfold", "auto")
        times_here = (f"unfold (ops.unfold) {median_ms(seconds['ops.unfold'], settings.large_steps)}/step, "
                      f"channel_major (C++ im2col) {median_ms(seconds['auto'], settings.large_steps)}/step")
        rows.append(Row("9", "ResNet-50 train step: unfold without trainkit's kernels / auto (channel_major)", value,
                        "x", "reported", None, spread, times_here, where))
    value, spread = ratio(native_seconds, "native", "auto")
    rows.append(Row("9", "ResNet-50 train step: conv_impl native / auto (speed-up of auto)", value, "x", "reported",
                    None, spread, times, where))
    if eager is None:
        message = "PyTorch is not installed: pip install -e '.[bench]' (torch==2.13.0, CPU build)"
        rows.append(Row("9", "ResNet-50 train step: trainkit auto / PyTorch eager", None, "x", "<= 3", None, "",
                        message, where))
        rows.append(Row("6", "ResNet-50 samples/s: trainkit / PyTorch eager", None, "x", "reported", None, "",
                        message, where))
        return rows
    import torch
    eager_where = {**where, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    times += f", PyTorch eager {median_ms(seconds['torch'], settings.large_steps)}/step"
    value, spread = ratio(seconds, "auto", "torch")
    rows.append(Row("9", "ResNet-50 train step: trainkit auto / PyTorch eager", value, "x", "<= 3", value <= 3,
                    spread, times, eager_where))
    throughput, spread = ratio(seconds, "torch", "auto")  # same samples per step: inverse time ratio
    rows.append(Row("6", "ResNet-50 samples/s: trainkit / PyTorch eager", throughput, "x", "reported", None, spread,
                    times + "; same model, batch, optimizer (SGD momentum), threads", eager_where))
    return rows
