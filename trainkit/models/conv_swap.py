"""`model.conv_impl` for any network: every MindSpore `nn.Conv2d` in it swapped for trainkit's convolution.

A ported PyTorch network or a user's own is built from `nn.Conv2d`, whose CPU kernel runs at about 1.5 GFLOP/s
(docs/performance.md); the app swaps each one, after the network is built, for an `UnfoldConv2d` holding the very
same Parameter objects, so parameter names, checkpoints, fine-tuning and the optimizer see no difference.

The swapped convolutions keep NCHW activations. trainkit's own models can keep activations channel-major
((C, N, H, W)) between layers because they know every layer they hold; an arbitrary network's other ops
(a flatten, a view, a concatenation along channels) are not known to be layout-agnostic, so `channel_major`
(and `auto`) mean "trainkit's C++ im2col, NCHW" for them.
"""
from __future__ import annotations

import logging
from typing import Optional, Tuple

from mindspore import nn

from trainkit.models.conv import UnfoldConv2d, _pair, resolve_conv_impl

__all__ = ["swap_convolutions", "swappable"]

log = logging.getLogger("trainkit")


def swappable(conv: nn.Conv2d) -> Optional[Tuple[int, int]]:
    """The symmetric (pad_h, pad_w) an `UnfoldConv2d` computes `conv` with, or None where it cannot (NHWC,
    asymmetric padding, `pad_mode="same"` that pads unevenly or depends on the input's size)."""
    if conv.data_format != "NCHW":
        return None
    if conv.pad_mode == "valid":
        return 0, 0
    if conv.pad_mode == "pad":
        padding = conv.padding
        if isinstance(padding, int):
            return padding, padding
        top, bottom, left, right = padding
        return (top, left) if top == bottom and left == right else None
    # "same": MindSpore pads d * (k - 1) in all, the smaller half first; at stride 1 that is input-independent.
    (kh, kw), (sh, sw), (dh, dw) = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.dilation)
    total_h, total_w = dh * (kh - 1), dw * (kw - 1)
    if (sh, sw) != (1, 1) or total_h % 2 or total_w % 2:
        return None
    return total_h // 2, total_w // 2


def swap_convolutions(network: nn.Cell, conv_impl: str = "auto") -> int:
    """Replace each plain `nn.Conv2d` in `network` by the implementation `conv_impl` stands for, in place.

    `native` changes nothing. `unfold`, `channel_major` and `auto` (where it resolves to either) swap in an NCHW
    `UnfoldConv2d` that reuses the convolution's own `weight` and `bias` Parameters (same names, same memory).
    Subclasses of `nn.Conv2d` (trainkit's own, or a user's with its own `construct`) and convolutions an
    `UnfoldConv2d` cannot compute (see :func:`swappable`) are left as they are.

    Args:
        network: the built network (before the optimizer is made, so that its Parameters are these).
        conv_impl: one of `trainkit.models.conv.CONV_IMPLS`.

    Returns:
        How many convolutions were swapped.

    Raises:
        ValueError: `conv_impl` is not valid, or needs kernels that do not build here.
    """
    if resolve_conv_impl(conv_impl) == "native":
        return 0
    swapped, kept = 0, 0
    for _, parent in list(network.cells_and_names()):
        for key, child in list(parent._cells.items()):  # noqa: SLF001 - MindSpore keeps the children there
            if type(child) is not nn.Conv2d:  # pylint: disable=unidiomatic-typecheck
                continue
            padding = swappable(child)
            if padding is None:
                kept += 1
                continue
            _replace_child(parent, key, _unfold_like(child, padding))
            swapped += 1
    if kept:
        log.info("conv_impl=%s: %d of %d convolutions kept MindSpore's kernel (NHWC, or padding an im2col "
                 "convolution does not take)", conv_impl, kept, kept + swapped)
    return swapped


def _unfold_like(conv: nn.Conv2d, padding: Tuple[int, int]) -> UnfoldConv2d:
    """An NCHW `UnfoldConv2d` computing `conv`, holding `conv`'s own Parameter objects."""
    ph, pw = padding
    replacement = UnfoldConv2d(conv.in_channels, conv.out_channels, _pair(conv.kernel_size),
                               stride=_pair(conv.stride), pad_mode="pad", padding=(ph, ph, pw, pw),
                               dilation=_pair(conv.dilation), group=conv.group, has_bias=conv.has_bias,
                               weight_init="zeros", bias_init="zeros" if conv.has_bias else None,
                               dtype=conv.weight.dtype)
    # The Parameter objects themselves, not copies: their names (already prefixed by the network's layout), the
    # optimizer's and the checkpoints' view of them stay the same.
    replacement._params["weight"] = conv.weight  # noqa: SLF001
    if conv.has_bias:
        replacement._params["bias"] = conv.bias  # noqa: SLF001
    replacement.weight_init, replacement.bias_init = conv.weight_init, conv.bias_init  # its repr tells the truth
    replacement.set_train(conv.training)
    return replacement


def _replace_child(parent: nn.Cell, key: str, child: nn.Cell) -> None:
    """`parent`'s child `key` becomes `child`, without renaming its Parameters (Cell.__setattr__ would prefix them
    again); containers' own lists of their cells follow."""
    parent._cells[key] = child  # noqa: SLF001
    if isinstance(parent.__dict__.get("cell_list"), list):  # SequentialCell and CellList iterate this list
        parent.cell_list = list(parent._cells.values())  # noqa: SLF001
