"""What ``port`` writes for window attention (torchvision's Swin V1 and V2) and the functions it is made of.

torchvision marks its Swin helpers as leaves for ``torch.fx`` (``torch.fx.wrap``), so a trace sees one call to
``shifted_window_attention`` per block rather than the operations inside; each becomes a MindSpore function of the
same name and arguments written into the generated module. ``torch.roll`` has no MindSpore CPU kernel (``Roll``
is unregistered), so it is written as two slices and a concatenation per axis; its shifts are numbers, as a
window shift is. The attention mask of a shifted window is built from the padded input's shape as PyTorch builds
it, with tensor slice assignment (which MindSpore compiles in graph mode).

``F.pad``'s constant mode (Swin pads to whole windows and even sizes) is written as concatenations with filled
blocks, not ``ops.pad``: MindSpore 2.10 differentiates PadV3 into a PadV3 with negative paddings, whose CPU kernel
reads and writes out of bounds (wrong gradients from the second step on, then a corrupted heap: ``free(): invalid
pointer`` while a ported Swin trained, in graph mode).
"""
from __future__ import annotations

from typing import Callable, Dict

from trainkit.bridge.port.layers import Unsupported

HELPERS: Dict[str, str] = {
    "pad": '''
def pad(x, padding, mode="constant", value=None):
    """PyTorch's F.pad. The constant mode as concatenations with filled blocks (a negative amount crops): the
    gradient of MindSpore's PadV3 is a PadV3 with negative paddings, whose CPU kernel writes out of bounds."""
    if mode != "constant":
        return ops.pad(x, padding, mode=mode, value=value)
    value = 0.0 if value is None else value
    for index in range(len(padding) // 2):  # (before, after) of the last axis first, as PyTorch orders them
        axis = len(x.shape) - 1 - index
        before, after = padding[2 * index], padding[2 * index + 1]
        if before < 0:
            x = ops.narrow(x, axis, -before, x.shape[axis] + before)
        if after < 0:
            x = ops.narrow(x, axis, 0, x.shape[axis] + after)
        if before > 0:
            x = ops.cat((ops.full(x.shape[:axis] + (before,) + x.shape[axis + 1:], value, dtype=x.dtype), x), axis)
        if after > 0:
            x = ops.cat((x, ops.full(x.shape[:axis] + (after,) + x.shape[axis + 1:], value, dtype=x.dtype)), axis)
    return x
''',
    "roll": '''
def roll(x, shifts, dims):
    """PyTorch's torch.roll over the given axes (MindSpore's Roll has no CPU kernel): slices and a concatenation."""
    shifts = (shifts,) if isinstance(shifts, int) else shifts
    dims = (dims,) if isinstance(dims, int) else dims
    for shift, dim in zip(shifts, dims):
        size = x.shape[dim]
        shift = shift % size
        if shift:
            x = ops.cat((ops.narrow(x, dim, size - shift, shift), ops.narrow(x, dim, 0, size - shift)), dim)
    return x
''',
    "_patch_merging_pad": '''
def _patch_merging_pad(x):
    """torchvision's Swin patch merging: pad H and W to even sizes, then the four interleaved halves side by side."""
    h, w = x.shape[-3], x.shape[-2]
    x = pad(x, (0, 0, 0, w % 2, 0, h % 2))
    # x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :], x[..., 1::2, 1::2, :] side by side, as a
    # reshape and a permutation: a strided slice's gradient fails on CPU in graph mode (StridedSliceGrad)
    lead, (h, w, c) = x.shape[:-3], x.shape[-3:]
    n = len(lead)
    x = x.reshape(lead + (h // 2, 2, w // 2, 2, c))
    x = ops.permute(x, tuple(range(n)) + (n, n + 2, n + 3, n + 1, n + 4))
    return x.reshape(lead + (h // 2, w // 2, 4 * c))
''',
    "_get_relative_position_bias": '''
def _get_relative_position_bias(relative_position_bias_table, relative_position_index, window_size):
    """torchvision's Swin: the table's rows at the flat relative-position index, as (1, heads, N, N)."""
    n = window_size[0] * window_size[1]
    bias = ops.gather(relative_position_bias_table, relative_position_index, 0)
    return ops.permute(bias.reshape(n, n, -1), (2, 0, 1)).unsqueeze(0)
''',
    "shifted_window_attention": '''
def shifted_window_attention(x, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads, shift_size,
                             attention_dropout=0.0, dropout=0.0, qkv_bias=None, proj_bias=None, logit_scale=None,
                             training=True):
    """torchvision's shifted_window_attention (Swin V1, and V2 with logit_scale): pad to whole windows, shift,
    attend within each window (masked across the shift's seams), shift back, unpad. Its dropouts are ops.dropout."""
    b, h, w, c = x.shape
    pad_r = (window_size[1] - w % window_size[1]) % window_size[1]
    pad_b = (window_size[0] - h % window_size[0]) % window_size[0]
    x = pad(x, (0, 0, 0, pad_r, 0, pad_b))
    pad_h, pad_w = x.shape[1], x.shape[2]
    shift = [0 if window_size[0] >= pad_h else shift_size[0], 0 if window_size[1] >= pad_w else shift_size[1]]
    if shift[0] + shift[1] > 0:
        x = roll(x, (-shift[0], -shift[1]), (1, 2))
    windows = (pad_h // window_size[0]) * (pad_w // window_size[1])
    size = window_size[0] * window_size[1]
    x = x.reshape(b, pad_h // window_size[0], window_size[0], pad_w // window_size[1], window_size[1], c)
    x = ops.permute(x, (0, 1, 3, 2, 4, 5)).reshape(b * windows, size, c)
    if logit_scale is not None and qkv_bias is not None:
        third = qkv_bias.shape[0] // 3
        qkv_bias = ops.cat((qkv_bias[:third], ops.zeros_like(qkv_bias[third:2 * third]), qkv_bias[2 * third:]))
    # x @ weight.T on the tokens as one 2-D MatMul, and the attention's products as BatchMatMul with a transpose
    # flag: ops.matmul broadcasts a 2-D weight to every window first (BroadcastTo was 57 % of swin_t's training
    # step) and differentiates with Transpose kernels
    linear, batched, batched_t = ops.MatMul(transpose_b=True), ops.BatchMatMul(), ops.BatchMatMul(transpose_b=True)
    qkv = linear(x.reshape(-1, c), qkv_weight).reshape(b * windows, size, -1)
    if qkv_bias is not None:
        qkv = qkv + qkv_bias
    # q, k and v split along the features (a Split kernel): indexing a permuted (3, ...) tensor was 24 % of the step
    q, k, v = ops.split(qkv, c, -1)
    heads = (b * windows, size, num_heads, c // num_heads)
    q, k, v = (ops.permute(q.reshape(heads), (0, 2, 1, 3)), ops.permute(k.reshape(heads), (0, 2, 1, 3)),
               ops.permute(v.reshape(heads), (0, 2, 1, 3)))
    if logit_scale is not None:
        q = q / ops.clamp(ops.sqrt((q * q).sum(-1, keepdims=True)), min=1e-12)
        k = k / ops.clamp(ops.sqrt((k * k).sum(-1, keepdims=True)), min=1e-12)
        attn = batched_t(q, k) * ops.exp(ops.clamp(logit_scale, max=math.log(100.0)))
    else:
        attn = batched_t(q * (c // num_heads) ** -0.5, k)
    attn = attn + relative_position_bias
    if shift[0] + shift[1] > 0:
        mask = ops.zeros((pad_h, pad_w), x.dtype)
        h_slices = ((0, -window_size[0]), (-window_size[0], -shift[0]), (-shift[0], None))
        w_slices = ((0, -window_size[1]), (-window_size[1], -shift[1]), (-shift[1], None))
        count = 0
        for hs in h_slices:
            for ws in w_slices:
                mask[hs[0]:hs[1], ws[0]:ws[1]] = count
                count += 1
        mask = mask.reshape(pad_h // window_size[0], window_size[0], pad_w // window_size[1], window_size[1])
        mask = ops.permute(mask, (0, 2, 1, 3)).reshape(windows, size)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        mask = ops.select(mask != 0, ops.full_like(mask, -100.0), ops.zeros_like(mask))
        attn = attn.reshape(b, windows, num_heads, size, size) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.reshape(-1, num_heads, size, size)
    attn = ops.softmax(attn, -1)
    if attention_dropout > 0:
        attn = ops.dropout(attn, p=attention_dropout, training=training)
    x = batched(attn, v).swapaxes(1, 2).reshape(b * windows * size, c)
    x = linear(x, proj_weight)
    if proj_bias is not None:
        x = x + proj_bias
    if dropout > 0:
        x = ops.dropout(x, p=dropout, training=training)
    x = x.reshape(b, pad_h // window_size[0], pad_w // window_size[1], window_size[0], window_size[1], c)
    x = ops.permute(x, (0, 1, 3, 2, 4, 5)).reshape(b, pad_h, pad_w, c)
    if shift[0] + shift[1] > 0:
        x = roll(x, (shift[0], shift[1]), (1, 2))
    return ops.narrow(ops.narrow(x, 1, 0, h), 2, 0, w)
''',
}
#: The imports each helper needs beyond ``from mindspore import nn, ops``.
HELPER_IMPORTS = {"shifted_window_attention": ("math",)}
#: Helpers another helper needs written before it.
HELPER_NEEDS = {"shifted_window_attention": ("pad", "roll"), "_patch_merging_pad": ("pad",)}


def _pad(input, pad, mode="'constant'", value="None"):  # noqa: A002 - PyTorch's argument names
    options = "".join(f", {name}={code}" for name, code, default in [("mode", mode, "'constant'"),
                                                                      ("value", value, "None")] if code != default)
    return f"pad({input}, {pad}{options})"


def _roll(input, shifts, dims="None"):  # noqa: A002
    if dims == "None":
        raise Unsupported("torch.roll without dims (over the flattened tensor)")
    return f"roll({input}, {shifts}, {dims})"


def _window_attention(x, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads, shift_size,
                      attention_dropout="0.0", dropout="0.0", qkv_bias="None", proj_bias="None", logit_scale="None",
                      training="True"):
    arguments = [x, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads, shift_size]
    options = [f"{name}={code}" for name, code, default in [
        ("attention_dropout", attention_dropout, "0.0"), ("dropout", dropout, "0.0"), ("qkv_bias", qkv_bias, "None"),
        ("proj_bias", proj_bias, "None"), ("logit_scale", logit_scale, "None")] if code != default]
    return f"shifted_window_attention({', '.join([*arguments, *options])}, training=self.training)"


_SWIN = "torchvision.models.swin_transformer."
FUNCTIONS: Dict[str, Callable[..., str]] = {
    "torch.nn.functional.pad": _pad, "torch.roll": _roll,
    _SWIN + "shifted_window_attention": _window_attention,
    _SWIN + "_get_relative_position_bias": lambda table, index, window_size:
        f"_get_relative_position_bias({table}, {index}, {window_size})",
    _SWIN + "_patch_merging_pad": lambda x: f"_patch_merging_pad({x})",
}
#: The helper each function's code calls.
FUNCTION_HELPERS = {"torch.nn.functional.pad": "pad", "torch.roll": "roll",
                    _SWIN + "shifted_window_attention": "shifted_window_attention",
                    _SWIN + "_get_relative_position_bias": "_get_relative_position_bias",
                    _SWIN + "_patch_merging_pad": "_patch_merging_pad"}
METHODS: Dict[str, Callable[..., str]] = {"roll": _roll}
