"""Row 10: one pass over ResNet-50's gradients, MindSpore's per-tensor kernels against PyTorch's foreach kernels.

The wrapper's features are passes over the parameters or gradients (docs/performance.md counts them). This row
prices one pass of each kind on both sides, on the same 161 tensors (94 MB) and threads, so a feature's cost in
rows 2-3 can be read as passes times these figures. MindSpore 2.10 has no multi-tensor kernels on CPU: a pass is
one kernel per tensor inside one compiled graph (``HyperMap``); PyTorch's is one ``torch._foreach_*`` call.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import dtype as mstype

from bench.common import Row, Settings, setup, threads, timed
from bench.conv_impl import torch_available
from trainkit import kernels
from trainkit.models import resnet18, resnet50
from trainkit.step.ema import _update_shadow
from trainkit.step.grad_ops import add_into, added, float32_total, put_into, size_groups

_scaled = ops.MultitypeFuncGraph("scaled")


@_scaled.register("Tensor", "Tensor")
def _scaled_copy(factor, grad):
    return grad * factor


class _Pass(nn.Cell):
    """One pass of `kind` over `buffers` (Parameters, as the wrapper's `_grad_sum` or EMA shadows) and `grads`."""

    def __init__(self, kind: str, buffers: ParameterTuple):
        super().__init__()
        self.kind = kind
        self.buffers = buffers
        self.hyper_map = ops.HyperMap()
        self.factor = Tensor(0.001, mstype.float32)
        self.groups = size_groups(buffers)
        self.ema_all = kernels.ema_update_all_kernel()  # what the EMA and the wrapper call (all tensors float32)
        self.add_all = kernels.add_into_all_kernel()

    def construct(self, grads):
        if self.kind == "copy into":
            return self.hyper_map(put_into, self.buffers, grads)
        if self.kind == "add in place":
            return self.hyper_map(add_into, self.buffers, grads)
        if self.kind == "add, new tensor":
            return self.hyper_map(added, self.buffers, grads)
        if self.kind == "multiply, new tensor":
            return self.hyper_map(ops.partial(_scaled, self.factor), grads)
        if self.kind == "EMA update in place":
            return self.hyper_map(ops.partial(_update_shadow, self.factor), self.buffers, grads)
        if self.kind == FUSED_EMA:
            return (self.ema_all(*self.buffers, *grads, self.factor),)
        if self.kind == FUSED_ADD:
            return (self.add_all(*self.buffers, *grads),)
        return (ops.sqrt(float32_total(self.hyper_map, grads, self.groups, squared=True)),)  # global norm


KINDS = ("copy into", "add in place", "add, new tensor", "multiply, new tensor", "EMA update in place",
         "global norm")
FUSED_EMA = "EMA update in place, trainkit's fused C++ kernel, one call for all"  # trainkit/kernels/, where it builds
FUSED_ADD = "add in place, trainkit's fused C++ kernel, one call for all (gradient accumulation)"


def _torch_passes(arrays: List[np.ndarray]) -> Dict[str, Callable[[], object]]:
    import torch

    torch.set_num_threads(threads())
    buffers = [torch.from_numpy(a.copy()) for a in arrays]
    grads = [torch.from_numpy(a.copy()) for a in arrays]
    return {
        "copy into": lambda: torch._foreach_copy_(buffers, grads),
        "add in place": lambda: torch._foreach_add_(buffers, grads),
        "add, new tensor": lambda: torch._foreach_add(buffers, grads),
        "multiply, new tensor": lambda: torch._foreach_mul(grads, 0.001),
        "EMA update in place": lambda: torch._foreach_lerp_(buffers, grads, 0.001),
        FUSED_EMA: lambda: torch._foreach_lerp_(buffers, grads, 0.001),
        FUSED_ADD: lambda: torch._foreach_add_(buffers, grads),
        "global norm": lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))).item(),
    }


def run(settings: Settings) -> List[Row]:
    model = "resnet18" if settings.smoke else "resnet50"
    shapes = [p.shape for p in {"resnet18": resnet18, "resnet50": resnet50}[model](num_classes=10).trainable_params()]
    rng = np.random.RandomState(0)
    arrays = [(rng.randn(*shape) * 0.01).astype(np.float32) for shape in shapes]
    megabytes = sum(a.nbytes for a in arrays) / 1e6
    grads = tuple(Tensor(a) for a in arrays)
    buffers = ParameterTuple([Parameter(Tensor(a), name=f"buffer{i}") for i, a in enumerate(arrays)])
    calls = 1 if settings.smoke else 10

    def mindspore_pass(kind: str) -> Callable[[], object]:
        cell = _Pass(kind, buffers)
        return lambda: [cell(grads)[-1].asnumpy() for _ in range(calls)]

    kinds = KINDS
    kernel = kernels.ema_update_kernel()
    if kernel is not None:
        kinds = (*KINDS, FUSED_EMA, FUSED_ADD)
    sides = {f"ms {kind}": mindspore_pass(kind) for kind in kinds}
    have_torch = torch_available()
    if have_torch:
        sides.update({f"torch {kind}": (lambda call=call: [call() for _ in range(calls)])
                      for kind, call in _torch_passes(arrays).items() if kind in kinds})
    for call in sides.values():  # compile, and warm up
        call()
    seconds: Dict[str, List[float]] = {name: [] for name in sides}
    for _ in range(max(settings.reps, 1) + 2):  # each pass's repetitions back to back: they share no state
        for name, call in sides.items():
            seconds[name].append(timed(call) / calls)
    where = setup(model, "-", "-", tensors=len(arrays), megabytes=round(megabytes, 1), calls_per_rep=calls)
    rows = []
    if kernel is None:
        rows.append(Row("10", f"one pass, {FUSED_EMA}", None, "x", details=f"not built: {kernels.describe()}",
                        setup=where))
    for kind in kinds:
        ours = statistics.median(seconds[f"ms {kind}"])
        side = "trainkit" if kind in (FUSED_EMA, FUSED_ADD) else "MindSpore per-tensor"
        if have_torch:
            theirs = statistics.median(seconds[f"torch {kind}"])
            rows.append(Row("10", f"one pass, {kind}: {side} / PyTorch foreach ({model})",
                            ours / theirs, "x", "reported", None, "",
                            f"MindSpore {ours * 1000:.1f} ms, PyTorch {theirs * 1000:.1f} ms for "
                            f"{len(arrays)} tensors, {megabytes:.0f} MB", where))
        else:
            rows.append(Row("10", f"one pass, {kind}: {side} ({model}), ms", ours * 1000, "ms",
                            "reported", None, "", "PyTorch is not installed: no foreach side", where))
    return rows
