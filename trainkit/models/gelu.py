"""`model.gelu_impl` for any network: every exact `nn.GELU` in it run by trainkit's fused C++ kernel on CPU.

MindSpore 2.10's CPU GeLU and its gradient ran at about a tenth of PyTorch's on ConvNeXt's activations
(bench/family_speed.py), and a ported ConvNeXt, ViT or Swin spends more of its step there than in its
convolutions. The swap happens after the network is built, as `model.conv_impl`'s does: a GELU has no Parameters,
so checkpoints, fine-tuning and exports (which rebuild with `gelu_impl=native`) see no difference. The kernel
computes the same function as MindSpore's (``0.5 x (1 + erf(x / sqrt 2))``, float32), to within its rounding.
"""
from __future__ import annotations

from mindspore import nn

from trainkit.kernels import gelu_kernel
from trainkit.models.conv_swap import _replace_child

__all__ = ["GELU_IMPLS", "FusedGELU", "resolve_gelu_impl", "swap_gelus"]

#: `model.gelu_impl`'s values: `auto` is `fused` where trainkit's kernels build (on CPU), else `native`.
GELU_IMPLS = ("auto", "native", "fused")


class FusedGELU(nn.Cell):
    """The exact GELU (``approximate=False``) as one kernel forward and one backward, float32."""

    def __init__(self):
        super().__init__()
        self.gelu = gelu_kernel()
        if self.gelu is None:
            raise ValueError("gelu_impl=fused needs trainkit's C++ kernels, which cannot run here; use gelu_impl=auto")

    def construct(self, x):
        return self.gelu(x)


def resolve_gelu_impl(gelu_impl: str) -> str:
    """`native` or `fused`: what `gelu_impl` stands for here (`auto`: `fused` on CPU where the kernels build)."""
    import mindspore as ms

    if gelu_impl not in GELU_IMPLS:
        raise ValueError(f"gelu_impl must be one of {', '.join(GELU_IMPLS)}; got {gelu_impl!r}")
    if gelu_impl != "auto":
        return gelu_impl
    return "fused" if ms.get_context("device_target") == "CPU" and gelu_kernel() is not None else "native"


def swap_gelus(network: nn.Cell, gelu_impl: str = "auto") -> int:
    """Replace each exact `nn.GELU` in `network` by a `FusedGELU` where `gelu_impl` resolves to `fused`, in place;
    how many were swapped. The tanh approximation and subclasses are left as they are."""
    if resolve_gelu_impl(gelu_impl) == "native":
        return 0
    swapped = 0
    for _, parent in list(network.cells_and_names()):
        for key, child in list(parent._cells.items()):  # noqa: SLF001 - MindSpore keeps the children there
            if type(child) is nn.GELU and child.approximate == "none":  # pylint: disable=unidiomatic-typecheck
                replacement = FusedGELU()
                replacement.set_train(child.training)
                _replace_child(parent, key, replacement)
                swapped += 1
    return swapped
