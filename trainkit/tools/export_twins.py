"""Export-only twins: the layers MindSpore's ONNX exporter has no operator for, written with operators it has.

MindSpore 2.10's ONNX exporter stops on a network that uses any of these (``Can not find key ... in convert map``),
though each computes what an ONNX graph can. Each is swapped for a composition while the file is written, and
everything is put back after; checkpoints and the network the run trains are never changed, and the
written file is checked by onnxruntime against trainkit's own evaluation before it is kept.

=========================================  ==============================  ==========================================
layer or function                          MindSpore's operator            exported as
=========================================  ==============================  ==========================================
``nn.HSwish``, ``ops.hardswish``           HSwish                          ``x * relu6(x + 3) / 6``
``nn.HSigmoid``, ``ops.hardsigmoid``       HSigmoid                        ``relu6(x + 3) / 6``
``nn.GELU(approximate=False)``,            Erf                             ``x / 2 * (1 + erf(x / sqrt 2))``, erf by
``ops.gelu(approximate='none')``                                           Abramowitz-Stegun 7.1.26 (error <= 1.5e-7)
``nn.MaxPool2d`` padded or ``ceil_mode``,  MaxPool3DWithArgmax,            the input padded with -inf (concatenated),
``ops.max_pool2d``                         MaxPoolWithArgmaxV2             then an unpadded MaxPool
``nn.AvgPool2d`` padded or ``ceil_mode``,  AvgPool3D                       zero padding and an unpadded AveragePool,
``ops.avg_pool2d``                                                         divided by the window's count of counted
                                                                           elements (PyTorch's divisor)
``nn.AdaptiveAvgPool2d``,                  AdaptiveAvgPool2D               per output row then column, the mean (max)
``nn.AdaptiveMaxPool2d``, and ``ops``'     AdaptiveMaxPool2D               of PyTorch's bin ``[floor(i L / o),
``adaptive_avg/max_pool2d``                                                ceil((i + 1) L / o))``
``nn.GroupNorm``                           GroupNorm                       mean and variance over each group
``ops.pad``, constant mode                 PadV3                           concatenations with constant blocks
``ops.unbind``                             Unstack                         one slice per index
``ops.clamp``, ``ops.clip``                ClampScalar with one bound      ``minimum(maximum(x, min), max)``
                                           (the exporter needs both, as
                                           numbers)
``nn.Conv2d`` padded differently on the    (Conv: ``pads`` written in      zero padding concatenated, then an
two axes                                   MindSpore's order, not ONNX's)  unpadded Conv
=========================================  ==============================  ==========================================

``nn.LayerNorm``, ``nn.SiLU``, ``nn.GELU(approximate=True)``, ``nn.ReLU6`` and unpadded pooling export as they
are. :func:`trainkit.tools.deploy.onnx_twins` swaps a layer where its class is exactly MindSpore's
(:func:`twin_of`), and a function where a module that defines a Cell of the network (a ported ``model.py``) calls
it through its global ``ops``, which points at :mod:`trainkit.tools.export_ops` meanwhile. A max pooling with
dilation has no twin and still stops the export.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

from mindspore import nn, ops

SQRT_HALF = 1.0 / math.sqrt(2.0)
NEGATIVE_INFINITY = float("-inf")  # max pooling's padding
# Abramowitz and Stegun 7.1.26: erf(x) = 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p x), x >= 0
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


# ------------------------------------------------------------------- compositions (each a graph-mode function)
def hard_swish(x):
    """PyTorch's Hardswish: ``x * relu6(x + 3) / 6``."""
    return x * ops.relu6(x + 3.0) / 6.0


def hard_sigmoid(x):
    """PyTorch's Hardsigmoid: ``relu6(x + 3) / 6``."""
    return ops.relu6(x + 3.0) / 6.0


def erf(x):
    """erf without the Erf operator (Abramowitz-Stegun 7.1.26, absolute error at most 1.5e-7); no Reciprocal and
    no Sign either (the exporter lacks both): a division of tensors and a select."""
    magnitude = ops.abs(x)
    t = ops.ones_like(x) / (1.0 + _ERF_P * magnitude)
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    positive = 1.0 - poly * ops.exp(-magnitude * magnitude)
    return ops.where(x < 0, -positive, positive)


def gelu_erf(x):
    """PyTorch's exact GELU, ``x / 2 * (1 + erf(x / sqrt 2))``, with :func:`erf`."""
    return 0.5 * x * (1.0 + erf(x * SQRT_HALF))


def clamp(x, low=None, high=None):
    """PyTorch's clamp, ``min(max(x, low), high)`` (``high`` wins where ``low > high``), with Maximum and Minimum:
    MindSpore's exporter writes a clamp only with both bounds numbers, and stops on a one-sided one ("Max value only
    accepts type of int or float": Swin V2's ``clamp(norm, min=1e-12)``). A number bound becomes a tensor of `x`'s
    type, a tensor bound is cast to it."""
    if low is not None:
        x = ops.maximum(x, _bound(low, x.dtype))
    if high is not None:
        x = ops.minimum(x, _bound(high, x.dtype))
    return x


def _bound(value, dtype):
    if isinstance(value, (int, float)):
        return ops.scalar_to_tensor(value, dtype)
    return ops.cast(value, dtype)


def _pad_axis(x, axis, before, after, value):
    """`x` with `before` and `after` elements of `value` added on `axis` (concatenated: no Pad operator)."""
    parts = []
    if before > 0:
        shape = x.shape[:axis] + (before,) + x.shape[axis + 1:]
        parts.append(ops.full(shape, value, dtype=x.dtype))
    parts.append(x)
    if after > 0:
        shape = x.shape[:axis] + (after,) + x.shape[axis + 1:]
        parts.append(ops.full(shape, value, dtype=x.dtype))
    if len(parts) == 1:
        return x
    return ops.cat(parts, axis)


def constant_pad(x, padding, value):
    """``ops.pad``'s constant mode (PadV3): `padding` as PyTorch orders it, (before, after) of the last axis first;
    negative amounts crop."""
    for index in range(len(padding) // 2):
        axis = len(x.shape) - 1 - index
        before, after = padding[2 * index], padding[2 * index + 1]
        if before < 0:
            x = ops.narrow(x, axis, -before, x.shape[axis] + before)
        if after < 0:
            x = ops.narrow(x, axis, 0, x.shape[axis] + after)
        x = _pad_axis(x, axis, max(before, 0), max(after, 0), value)
    return x


def unbind(x, axis):
    """``ops.unbind`` (Unstack): the slices along `axis`, each without it."""
    axis = axis + len(x.shape) if axis < 0 else axis
    parts = []
    for index in range(x.shape[axis]):
        parts.append(ops.squeeze(ops.narrow(x, axis, index, 1), axis))
    return tuple(parts)


def pool_windows(length, kernel, stride, padding, ceil_mode):
    """(outputs, padding after the input) of PyTorch's pooling along one axis: the padded length an unpadded pooling
    needs to give PyTorch's output count (its ceil_mode rule: the last window starts inside the input or the left
    padding)."""
    span = length + 2 * padding - kernel + ((stride - 1) if ceil_mode else 0)
    outputs = span // stride + 1
    if ceil_mode and (outputs - 1) * stride >= length + padding:
        outputs = outputs - 1
    needed = (outputs - 1) * stride + kernel
    return outputs, max(needed - length - padding, 0)


def max_pool_2d(x, kernel, stride, padding, ceil_mode):
    """PyTorch's max_pool2d (dilation 1): -inf padding, then an unpadded MaxPool."""
    _, after_h = pool_windows(x.shape[2], kernel[0], stride[0], padding[0], ceil_mode)
    _, after_w = pool_windows(x.shape[3], kernel[1], stride[1], padding[1], ceil_mode)
    x = _pad_axis(x, 2, padding[0], after_h, NEGATIVE_INFINITY)
    x = _pad_axis(x, 3, padding[1], after_w, NEGATIVE_INFINITY)
    return ops.MaxPool(kernel_size=kernel, strides=stride)(x)


def _counted(length, padding, after, include_padding, dtype):
    """One axis' mask of the elements PyTorch counts in an average's divisor: the input, and with count_include_pad
    the padding on both sides too (a ceil_mode window's part beyond that is never counted)."""
    ones = ops.ones((1, 1, length, 1), dtype)
    if include_padding:
        ones = _pad_axis(ones, 2, padding, min(after, padding), 1.0)
        return _pad_axis(ones, 2, 0, after - min(after, padding), 0.0)
    return _pad_axis(ones, 2, padding, after, 0.0)


def avg_pool_2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """PyTorch's avg_pool2d: zero padding, an unpadded AveragePool, and PyTorch's divisor (the counted elements of
    each window, or `divisor_override` when above 0)."""
    _, after_h = pool_windows(x.shape[2], kernel[0], stride[0], padding[0], ceil_mode)
    _, after_w = pool_windows(x.shape[3], kernel[1], stride[1], padding[1], ceil_mode)
    pool = ops.AvgPool(kernel_size=kernel, strides=stride)
    padded = _pad_axis(_pad_axis(x, 2, padding[0], after_h, 0.0), 3, padding[1], after_w, 0.0)
    mean = pool(padded)
    if divisor_override > 0:
        return mean * (kernel[0] * kernel[1] / divisor_override)
    rows = _counted(x.shape[2], padding[0], after_h, count_include_pad, x.dtype)
    columns = ops.swapaxes(_counted(x.shape[3], padding[1], after_w, count_include_pad, x.dtype), 2, 3)
    return mean / pool(rows * columns)


def _adaptive_axis(x, axis, size, use_max):
    """`x` pooled to `size` along `axis` over PyTorch's adaptive bins (mean, or max)."""
    length = x.shape[axis]
    if size == length:
        return x
    parts = []
    for index in range(size):
        start = (index * length) // size
        end = -((-(index + 1) * length) // size)
        piece = ops.narrow(x, axis, start, end - start)
        parts.append(piece.max(axis=axis, keepdims=True) if use_max else ops.mean(piece, axis, keep_dims=True))
    if size == 1:
        return parts[0]
    return ops.cat(parts, axis)


def adaptive_pool_2d(x, output_size, use_max):
    """PyTorch's adaptive average (max) pooling to `output_size` (-1 or None keeps a side): separable, so the rows'
    bins, then the columns'."""
    height = x.shape[2] if output_size[0] is None or output_size[0] < 0 else output_size[0]
    width = x.shape[3] if output_size[1] is None or output_size[1] < 0 else output_size[1]
    return _adaptive_axis(_adaptive_axis(x, 2, height, use_max), 3, width, use_max)


def group_norm(x, groups, gamma, beta, eps):
    """GroupNorm of an NC... tensor: each group's mean and biased variance, then the per-channel affine."""
    shape = x.shape
    grouped = ops.reshape(x, (shape[0], groups, -1))
    mean = ops.mean(grouped, 2, keep_dims=True)
    centred = grouped - mean
    variance = ops.mean(centred * centred, 2, keep_dims=True)
    normalised = ops.reshape(centred / ops.sqrt(variance + eps), shape)
    affine = (1, shape[1]) + (1,) * (len(shape) - 2)
    return normalised * ops.reshape(gamma, affine) + ops.reshape(beta, affine)


# ------------------------------------------------------------------- twin Cells
class HSwishTwin(nn.Cell):
    """nn.HSwish as :func:`hard_swish`."""

    def construct(self, x):
        return hard_swish(x)


class HSigmoidTwin(nn.Cell):
    """nn.HSigmoid as :func:`hard_sigmoid`."""

    def construct(self, x):
        return hard_sigmoid(x)


class GELUTwin(nn.Cell):
    """nn.GELU(approximate=False) as :func:`gelu_erf`."""

    def construct(self, x):
        return gelu_erf(x)


class MaxPool2dTwin(nn.Cell):
    """A padded or ceil_mode nn.MaxPool2d as :func:`max_pool_2d`."""

    def __init__(self, kernel: Tuple[int, int], stride: Tuple[int, int], padding: Tuple[int, int], ceil_mode: bool):
        super().__init__()
        self.kernel, self.stride, self.padding, self.ceil_mode = kernel, stride, padding, ceil_mode

    def construct(self, x):
        return max_pool_2d(x, self.kernel, self.stride, self.padding, self.ceil_mode)


class AvgPool2dTwin(nn.Cell):
    """A padded or ceil_mode nn.AvgPool2d as :func:`avg_pool_2d`."""

    def __init__(self, kernel: Tuple[int, int], stride: Tuple[int, int], padding: Tuple[int, int], ceil_mode: bool,
                 count_include_pad: bool, divisor_override: int):
        super().__init__()
        self.kernel, self.stride, self.padding, self.ceil_mode = kernel, stride, padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def construct(self, x):
        return avg_pool_2d(x, self.kernel, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                           self.divisor_override)


class AdaptivePool2dTwin(nn.Cell):
    """nn.AdaptiveAvgPool2d or nn.AdaptiveMaxPool2d as :func:`adaptive_pool_2d`."""

    def __init__(self, output_size: Tuple[int, int], use_max: bool):
        super().__init__()
        self.output_size, self.use_max = output_size, use_max

    def construct(self, x):
        return adaptive_pool_2d(x, self.output_size, self.use_max)


class Conv2dTwin(nn.Cell):
    """An nn.Conv2d padded differently on the two axes (a 1x3 kernel with padding (0, 1)): MindSpore's exporter
    writes ONNX's ``pads`` in its own order (top, bottom, left, right) where ONNX reads (top, left, bottom, right),
    and onnxruntime then refuses the file or computes other shapes. Here the zero padding is concatenated and the
    convolution unpadded, on the original layer's own ``weight`` and ``bias`` (the same Parameters)."""

    def __init__(self, original: nn.Conv2d):
        super().__init__(auto_prefix=False)
        self.pads = tuple(int(side) for side in original.padding)  # (top, bottom, left, right)
        self.weight = original.weight
        self.bias = original.bias if original.has_bias else None
        self.conv2d = ops.Conv2D(out_channel=original.out_channels, kernel_size=original.kernel_size, mode=1,
                                 pad_mode="valid", stride=original.stride, dilation=original.dilation,
                                 group=original.group)

    def construct(self, x):
        x = _pad_axis(x, 2, self.pads[0], self.pads[1], 0.0)
        x = _pad_axis(x, 3, self.pads[2], self.pads[3], 0.0)
        output = self.conv2d(x, self.weight)
        if self.bias is not None:
            output = ops.bias_add(output, self.bias)
        return output


class GroupNormTwin(nn.Cell):
    """nn.GroupNorm as :func:`group_norm`, on the original layer's own ``gamma`` and ``beta`` (the same Parameters:
    nothing is copied, and no name changes)."""

    def __init__(self, original: nn.GroupNorm):
        super().__init__(auto_prefix=False)
        self.groups, self.eps = original.num_groups, float(original.eps)
        self.gamma, self.beta = original.gamma, original.beta

    def construct(self, x):
        return group_norm(x, self.groups, self.gamma, self.beta, self.eps)


def _pair(values: Sequence[int]) -> Tuple[int, int]:
    return int(values[-2]), int(values[-1])


def twin_of(cell: nn.Cell) -> Optional[nn.Cell]:
    """The export twin of `cell`, or None where it exports as it is (or has no twin)."""
    kind = type(cell)
    if kind is nn.HSwish:
        return HSwishTwin()
    if kind is nn.HSigmoid:
        return HSigmoidTwin()
    if kind is nn.GELU and getattr(cell, "approximate", None) == "none":
        return GELUTwin()
    if kind is nn.MaxPool2d and getattr(cell, "use_pad", False):
        attrs = cell.max_pool.attrs  # MaxPool3DWithArgmax on an added depth axis: (1, h, w) each
        if tuple(attrs["dilation"][-2:]) != (1, 1) or cell.return_indices:
            return None
        return MaxPool2dTwin(_pair(attrs["ksize"]), _pair(attrs["strides"]), _pair(attrs["pads"]),
                             bool(attrs["ceil_mode"]))
    if kind is nn.AvgPool2d and type(getattr(cell, "avg_pool", None)).__name__ == "AvgPool3D":
        attrs = cell.avg_pool.attrs  # (front, back, top, bottom, left, right) padding; top == bottom from PyTorch
        pad = attrs["pad_list"]
        if pad[2] != pad[3] or pad[4] != pad[5]:
            return None
        return AvgPool2dTwin(_pair(attrs["kernel_size"]), _pair(attrs["strides"]), (int(pad[2]), int(pad[4])),
                             bool(attrs["ceil_mode"]), bool(attrs["count_include_pad"]),
                             int(attrs["divisor_override"]))
    if kind is nn.AdaptiveAvgPool2d:
        return AdaptivePool2dTwin(_pair(cell.adaptive_avgpool2d.attrs["output_size"]), use_max=False)
    if kind is nn.AdaptiveMaxPool2d and not cell.return_indices:
        size = cell.output_size if isinstance(cell.output_size, tuple) else (cell.output_size, cell.output_size)
        return AdaptivePool2dTwin(tuple(-1 if side is None else int(side) for side in size), use_max=True)
    if kind is nn.GroupNorm and cell.affine:
        return GroupNormTwin(cell)
    if (kind is nn.Conv2d and cell.pad_mode == "pad" and isinstance(cell.padding, tuple)
            and cell.data_format == "NCHW" and cell.padding[0:2] != cell.padding[2:4]):
        return Conv2dTwin(cell)
    return None
