"""Convolution chosen by config (`model.conv_impl`): MindSpore's own kernel, or the same arithmetic as a MatMul.

MindSpore 2.10's CPU kernel for a 3x3 `nn.Conv2d` runs at about 1.5 GFLOP/s, while its MatMul runs at about 160.
Writing the convolution as im2col (`ops.unfold`) followed by one MatMul gives the same numbers (to float32
rounding) and trains ResNet-50 on CPU many times faster; DEVELOPERS.md ("Convolution variants tried") holds the
measurements of every variant tried. Each implementation is an `nn.Conv2d` subclass that only replaces
`construct`, so parameter names and shapes (`weight` as (out, in / groups, kh, kw), `bias`), initialisation,
checkpoints, weight import and EMA are the same whichever is chosen.
"""
from __future__ import annotations

from typing import List, Tuple, Union

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from trainkit import kernels
from trainkit.kernels import conv_output_size, depthwise_kernel, geometry_values, im2col_kernel

__all__ = ["CONV_IMPLS", "ChannelMajorBatchNorm2d", "ChannelMajorMaxPool2d", "UnfoldConv2d", "batch_norm2d",
           "conv2d", "max_pool2d", "resolve_conv_impl"]

#: Accepted values of `conv_impl`: `auto` picks the fastest measured one for the device target.
CONV_IMPLS = ("auto", "native", "unfold", "channel_major")


def resolve_conv_impl(conv_impl: str, device_target: str = None) -> str:
    """The implementation `conv_impl` stands for.

    `auto` is `channel_major` on CPU where trainkit's C++ kernels build (`trainkit.kernels`), else `unfold` on
    CPU, and `native` on GPU/Ascend. `channel_major` is `unfold` with the kernels' im2col and the network's
    activations kept as (C, N, H, W) between layers, which removes the transposes around every MatMul.

    Args:
        conv_impl: one of `CONV_IMPLS`.
        device_target: "CPU", "GPU" or "Ascend"; None reads MindSpore's context.

    Raises:
        ValueError: `conv_impl` is not one of `CONV_IMPLS`, or is `channel_major` where the kernels do not build.
    """
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl must be one of {', '.join(CONV_IMPLS)}; got {conv_impl!r}")
    if device_target is None:
        device_target = ms.get_context("device_target")
    if conv_impl == "channel_major" and (device_target != "CPU" or kernels.library()[0] is None):
        why = kernels.library()[1] if device_target == "CPU" else f"the device is {device_target}"
        raise ValueError(f"conv_impl=channel_major needs trainkit's C++ kernels, which cannot run here ({why}); "
                         "use conv_impl=unfold or auto")
    if conv_impl != "auto":
        return conv_impl
    if device_target != "CPU":
        return "native"
    return "channel_major" if kernels.library()[0] is not None else "unfold"


def conv2d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
           has_bias: bool = False, group: int = 1, conv_impl: str = "native", weight_init=None) -> nn.Conv2d:
    """A torch-style convolution (explicit symmetric `padding`, NCHW) built by the chosen implementation.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, has_bias, group, weight_init: as `nn.Conv2d`
            with `pad_mode="pad"` (`weight_init=None`: MindSpore's default, HeUniform).
        conv_impl: one of `CONV_IMPLS` (see `resolve_conv_impl`).

    Returns:
        An `nn.Conv2d` (or subclass): the same Parameters whichever implementation runs.
    """
    conv_impl = resolve_conv_impl(conv_impl)
    arguments = dict(stride=stride, pad_mode="pad", padding=padding, has_bias=has_bias, group=group,
                     weight_init=weight_init)
    if conv_impl == "native":
        return nn.Conv2d(in_channels, out_channels, kernel_size, **arguments)
    return UnfoldConv2d(in_channels, out_channels, kernel_size, channel_major=conv_impl == "channel_major",
                        **arguments)


def batch_norm2d(channels: int, conv_impl: str = "native") -> nn.BatchNorm2d:
    """`nn.BatchNorm2d(channels)` for the activations' layout that `conv_impl` gives (same Parameters)."""
    return (ChannelMajorBatchNorm2d if resolve_conv_impl(conv_impl) == "channel_major" else nn.BatchNorm2d)(channels)


def max_pool2d(kernel_size: int, stride: int, padding: int, conv_impl: str = "native") -> nn.MaxPool2d:
    """torch's `MaxPool2d(kernel_size, stride, padding)` (padding with -inf) for the layout `conv_impl` gives."""
    cell = ChannelMajorMaxPool2d if resolve_conv_impl(conv_impl) == "channel_major" else nn.MaxPool2d
    return cell(kernel_size=kernel_size, stride=stride, pad_mode="pad", padding=padding)


class ChannelMajorBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d over (C, N, H, W) activations: the same statistics and Parameters as over (N, C, H, W).

    (C, N, H, W) viewed as (1, C, N * H, W) without a copy is a layout BatchNorm2d takes, with the same values
    per channel; the output is viewed back.
    """

    channel_major = True

    def construct(self, x):
        channels, n, height, width = x.shape
        # nn.BatchNorm2d.construct, not super().construct: amp O1 rewrites the network into subclasses that copy
        # this source, where super() is this class again (infinite recursion).
        normalised = nn.BatchNorm2d.construct(self, x.reshape((1, channels, n * height, width)))
        return normalised.reshape((channels, n, height, width))


class ChannelMajorMaxPool2d(nn.MaxPool2d):
    """MaxPool2d over (C, N, H, W) activations: each (channel, image) plane pooled on its own, as over NCHW."""

    channel_major = True

    def construct(self, x):
        channels, n, height, width = x.shape
        pooled = nn.MaxPool2d.construct(self, x.reshape((1, channels * n, height, width)))  # not super(): see above
        return pooled.reshape((channels, n) + pooled.shape[2:])


def _pair(value: Union[int, Tuple[int, ...]]) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _symmetric_padding(padding) -> Tuple[int, int]:
    """(pad_h, pad_w) from nn.Conv2d's `padding` (an int or top, bottom, left, right) when top == bottom etc."""
    if isinstance(padding, int):
        return padding, padding
    top, bottom, left, right = padding
    if top != bottom or left != right:
        raise ValueError(f"padding must be symmetric (top == bottom, left == right) for this conv_impl; "
                         f"got {padding!r}; use conv_impl=native")
    return top, left


class UnfoldConv2d(nn.Conv2d):
    """A convolution as one MatMul: the weight, viewed as (out, in / groups * kh * kw), times the input's columns.

    The columns come from MindSpore's im2col (`ops.unfold`), transposed to (in * kh * kw, batch * out_h * out_w),
    channel-major then kernel offset: the order of the weight's own layout. The MatMul is then a single 2-D
    product (a 2-D weight against per-sample columns would make MindSpore broadcast the weight to every sample
    first, which cost more than the convolution); groups are a batched product over the groups. 1x1 convolutions
    skip im2col: a transpose (after a strided slice for stride > 1) gives the columns, and the MatMul is faster
    than MindSpore's 1x1 kernel too. Supports pad_mode `pad` (symmetric) or `valid`, NCHW, any stride, dilation
    and groups.

    On CPU, where trainkit's C++ kernels build (`trainkit.kernels`), float32 columns come from its im2col kernel
    instead, already in the MatMul's layout, with its col2im as the gradient: the same values as `ops.unfold`
    and its gradient (docs/performance.md, row 6). With `channel_major=True` (which needs the kernels) the input
    and output are (C, N, H, W): the columns are read from that layout and the MatMul's (out, N * H * W) result
    is the output as it stands, so neither side is transposed.
    """

    def __init__(self, *args, channel_major: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.channel_major = bool(channel_major)
        if self.pad_mode not in ("pad", "valid"):
            raise ValueError(f"pad_mode must be 'pad' or 'valid' for this conv_impl; got {self.pad_mode!r}; "
                             "use conv_impl=native")
        if self.data_format != "NCHW":
            raise ValueError(f"data_format must be NCHW for this conv_impl; got {self.data_format!r}")
        self.kh, self.kw = _pair(self.kernel_size)
        self.sh, self.sw = _pair(self.stride)
        self.dh, self.dw = _pair(self.dilation)
        self.ph, self.pw = _symmetric_padding(self.padding) if self.pad_mode == "pad" else (0, 0)
        self.groups = self.group
        self.out_per_group = self.out_channels // self.group
        self.depth = self.in_channels // self.group * self.kh * self.kw  # columns per output channel
        self.pointwise = self.kh == 1 and self.kw == 1 and self.ph == 0 and self.pw == 0
        # The MatMul primitives, not ops.matmul: ops.matmul's gradient (MatMulExt's) transposes its operands with
        # Transpose kernels, 40 % of ResNet-50's step on CPU; MatMul's gradient is MatMuls with transpose flags.
        self.matmul = ops.MatMul()
        self.batch_matmul = ops.BatchMatMul()
        geometry = (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw, self.dh, self.dw)
        # A 1x1 convolution at stride 1 without padding takes its input as its columns; every other one takes them
        # from trainkit's im2col kernel where it builds (a strided 1x1 included: one pass instead of a StridedSlice).
        self.identity_columns = self.pointwise and self.sh == 1 and self.sw == 1
        # A depthwise convolution (one filter per channel: MobileNets, EfficientNet, ConvNeXt's 7x7) runs as one
        # direct kernel where it builds: its columns would be kh * kw copies of the input for a product of one row
        # each (ConvNeXt-T's 7x7 took a third of its step that way).
        depthwise = self.group > 1 and self.group == self.in_channels == self.out_channels and not self.pointwise
        self.depthwise = depthwise_kernel(geometry, self.channel_major) if depthwise else None
        self.im2col = None if self.identity_columns or self.depthwise is not None else \
            im2col_kernel(geometry, self.channel_major)
        self.geometry = Tensor(np.array(geometry_values(geometry, self.channel_major), np.int64))
        if self.channel_major and self.im2col is None and self.depthwise is None and not self.identity_columns:
            raise ValueError(f"channel_major needs trainkit's C++ kernels, which cannot run here "
                             f"({kernels.library()[1]}); use conv_impl=unfold")

    def construct(self, x):
        if self.depthwise is not None:
            return self._direct_depthwise(x)
        if self.channel_major:  # (C, N, H, W) in and out
            _, n, height, width = x.shape
            return self._product(self._kernel_columns(x), n, height, width)
        n, _, height, width = x.shape
        if self.im2col is not None:
            cols = self._kernel_columns(x)
        elif self.pointwise:
            if self.sh > 1 or self.sw > 1:
                # ops.strided_slice, not x[:, :, ::s, ::s]: the latter's gradient fails in pynative mode on CPU
                # ("StridedSliceGrad ... input memory out of bounds", MindSpore 2.10).
                x = ops.strided_slice(x, (0, 0, 0, 0), x.shape, (1, 1, self.sh, self.sw))
            cols = x.transpose(1, 0, 2, 3)
        else:
            cols = ops.unfold(x, (self.kh, self.kw), (self.dh, self.dw), (self.ph, self.pw), (self.sh, self.sw))
            cols = cols.transpose(1, 0, 2)
        return self._product(cols, n, height, width).transpose(1, 0, 2, 3)

    def _direct_depthwise(self, x):
        """The depthwise kernel's output in x's layout, plus the bias (float32 kernels, as the columns')."""
        if x.dtype == ms.float32 and self.weight.dtype == ms.float32:
            y = self.depthwise(x, self.weight, self.geometry)
        else:  # the kernels are float32 only
            y = self.depthwise(x.astype(ms.float32), self.weight.astype(ms.float32), self.geometry).astype(x.dtype)
        if self.has_bias:
            shape = (-1, 1, 1, 1) if self.channel_major else (1, -1, 1, 1)
            y = y + self.bias.reshape(shape).astype(y.dtype)
        return y

    def _kernel_columns(self, x):
        """(in * kh * kw, batch * out_h * out_w) from the kernel (x itself for a 1x1 at stride 1)."""
        if self.im2col is None:
            return x
        if x.dtype == ms.float32:
            return self.im2col(x, self.geometry)
        return self.im2col(x.astype(ms.float32), self.geometry).astype(x.dtype)  # the kernel is float32 only

    def _product(self, cols, n, height, width):
        """The weight times the columns, plus the bias: (out, N, out_h, out_w)."""
        out_h = conv_output_size(height, self.kh, self.sh, self.ph, self.dh)
        out_w = conv_output_size(width, self.kw, self.sw, self.pw, self.dw)
        weight = self.weight.astype(cols.dtype)
        if self.groups == 1:
            y = self.matmul(weight.reshape((self.out_channels, self.depth)), cols.reshape((self.depth, -1)))
        else:
            y = self.batch_matmul(weight.reshape((self.groups, self.out_per_group, self.depth)),
                                  cols.reshape((self.groups, self.depth, -1)))
        y = y.reshape((self.out_channels, n, out_h, out_w))
        if self.has_bias:
            y = y + self.bias.reshape((-1, 1, 1, 1)).astype(y.dtype)
        return y


def kernel_convolutions(network: nn.Cell) -> List[str]:
    """The names (their weights' without ``.weight``) of `network`'s convolutions that take their columns from
    trainkit's float32 im2col kernel.

    Op by op (PyNative), MindSpore casts the inputs of every operator inside a ``to_float(float16)`` Cell -- the
    kernel's too, which then reads half-precision memory as float32 (the small CNN at amp O2: losses of 50-320
    for 2.3). In a graph only the Cell's own inputs are cast, and the convolution casts its columns itself.
    """
    return [cell.weight.name.rsplit(".", 1)[0] for _, cell in network.cells_and_names()
            if isinstance(cell, UnfoldConv2d) and (cell.im2col is not None or cell.depthwise is not None)]

