"""The ResNet family with torchvision's parameter names and layout, so torchvision checkpoints map onto it by name.

Names match torchvision's `resnet*` one to one (`conv1.weight`, `layer1.0.downsample.0.weight`, `fc.bias`, ...),
except that MindSpore's BatchNorm calls its parameters gamma/beta/moving_mean/moving_variance where torch says
weight/bias/running_mean/running_var. Bottleneck puts the stride on the 3x3 conv (torchvision's "v1.5").
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Optional, Sequence, Type, Union

import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import HeNormal, HeUniform, Initializer, initializer

from trainkit.checks import check_bool, check_int
from trainkit.models.conv import batch_norm2d, conv2d, resolve_conv_impl

__all__ = [
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "init_like_torchvision",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]


class _DefaultInitsSeed(Initializer):
    """``nn.Conv2d``'s default weight init (HeUniform) as NumPy's global random stream sees it, without the draw.

    MindSpore seeds each random initializer with one number from NumPy's global stream. A ResNet's convolutions
    are built with that default, then :func:`init_like_torchvision` replaces every one of their weights; drawing
    the default was 0.1-0.2 s of ResNet-50's 0.8 s construction, all of it thrown away. This initializer takes the
    one number HeUniform would have taken and leaves zeros, so the draws after it -- and a seed's initial
    weights -- are bitwise those of drawing the default and replacing it.
    """

    def _initialize(self, arr):
        np.random.randint(low=1, high=1 << 63, dtype=np.int64)  # as mindspore.common.initializer._numpy_seed
        arr.fill(0)  # MindSpore hands an uninitialised array (its own Zero initializer draws no seed)


#: Whether this thread is inside a ResNet's __init__, which replaces every convolution's weight at its end.
_inside_resnet_init: contextvars.ContextVar = contextvars.ContextVar("inside_resnet_init", default=False)


@contextlib.contextmanager
def _replaced_at_the_end() -> Iterator[None]:
    """Inside, the convolutions built take :class:`_DefaultInitsSeed`: for a network that ends its __init__ with
    :func:`init_like_torchvision`."""
    token = _inside_resnet_init.set(True)
    try:
        yield
    finally:
        _inside_resnet_init.reset(token)


def _weight_init():
    """A convolution's `weight_init`: the default's seed only inside a ResNet's __init__, else MindSpore's (None)."""
    return _DefaultInitsSeed() if _inside_resnet_init.get() else None


def conv3x3(in_channels: int, out_channels: int, stride: int = 1, conv_impl: str = "native") -> nn.Conv2d:
    """3x3 conv with torch's explicit padding of 1 (MindSpore's default "same" padding differs at stride 2)."""
    return conv2d(in_channels, out_channels, 3, stride=stride, padding=1, conv_impl=conv_impl,
                  weight_init=_weight_init())


def conv1x1(in_channels: int, out_channels: int, stride: int = 1, conv_impl: str = "native") -> nn.Conv2d:
    return conv2d(in_channels, out_channels, 1, stride=stride, padding=0, conv_impl=conv_impl,
                  weight_init=_weight_init())


def _downsample(in_channels: int, out_channels: int, stride: int, conv_impl: str) -> nn.SequentialCell:
    """Projection shortcut; a SequentialCell so the names are torchvision's `downsample.0` (conv) / `.1` (BN)."""
    return nn.SequentialCell([conv1x1(in_channels, out_channels, stride, conv_impl),
                              batch_norm2d(out_channels, conv_impl)])


class BasicBlock(nn.Cell):
    """Two 3x3 convs plus the shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1, downsample: Optional[nn.Cell] = None,
                 conv_impl: str = "native"):
        super().__init__()
        self.conv1 = conv3x3(in_channels, channels, stride, conv_impl)
        self.bn1 = batch_norm2d(channels, conv_impl)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(channels, channels, conv_impl=conv_impl)
        self.bn2 = batch_norm2d(channels, conv_impl)
        self.downsample = downsample

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)

    def last_bn(self) -> nn.BatchNorm2d:
        """The BN whose gamma `zero_init_residual` zeroes, so the block starts as the identity."""
        return self.bn2


class Bottleneck(nn.Cell):
    """1x1 reduce, 3x3 (carrying the stride, as torchvision v1.5), 1x1 expand x4, plus the shortcut (ResNet-50+)."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1, downsample: Optional[nn.Cell] = None,
                 conv_impl: str = "native"):
        super().__init__()
        self.conv1 = conv1x1(in_channels, channels, conv_impl=conv_impl)
        self.bn1 = batch_norm2d(channels, conv_impl)
        self.conv2 = conv3x3(channels, channels, stride, conv_impl)
        self.bn2 = batch_norm2d(channels, conv_impl)
        self.conv3 = conv1x1(channels, channels * self.expansion, conv_impl=conv_impl)
        self.bn3 = batch_norm2d(channels * self.expansion, conv_impl)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)

    def last_bn(self) -> nn.BatchNorm2d:
        """The BN whose gamma `zero_init_residual` zeroes, so the block starts as the identity."""
        return self.bn3


Block = Union[Type[BasicBlock], Type[Bottleneck]]


def init_like_torchvision(network: nn.Cell, zero_init_residual: bool = False) -> None:
    """Initialise as torchvision's ResNet does, so training from scratch behaves like the torch reference.

    Convs: He normal, fan_out, ReLU gain. BatchNorm: gamma 1, beta 0. Dense: He uniform with a = sqrt(5)
    (torch's default Linear weight, bound 1/sqrt(fan_in)) and a zero bias. With `zero_init_residual`, the last BN
    gamma of every residual block is zero, so each block starts as the identity (https://arxiv.org/abs/1706.02677).
    """
    for _, cell in network.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            weight = cell.weight
            cell.weight_init = HeNormal(mode="fan_out", nonlinearity="relu")  # what the weight holds (its repr)
            weight.set_data(initializer(cell.weight_init, weight.shape, weight.dtype))
        elif isinstance(cell, (nn.BatchNorm2d, nn.GroupNorm)):
            cell.gamma.set_data(initializer("ones", cell.gamma.shape, cell.gamma.dtype))
            cell.beta.set_data(initializer("zeros", cell.beta.shape, cell.beta.dtype))
        elif isinstance(cell, nn.Dense):
            weight = cell.weight
            weight.set_data(initializer(HeUniform(negative_slope=math.sqrt(5)), weight.shape, weight.dtype))
            if cell.bias is not None:
                cell.bias.set_data(initializer("zeros", cell.bias.shape, cell.bias.dtype))
    if zero_init_residual:
        for _, cell in network.cells_and_names():
            if isinstance(cell, (BasicBlock, Bottleneck)):
                gamma = cell.last_bn().gamma
                gamma.set_data(initializer("zeros", gamma.shape, gamma.dtype))




class ResNet(nn.Cell):
    """ResNet (He et al. 2015) laid out as torchvision's, ending in global average pooling and `fc`.

    Global pooling is a mean over H and W, so any input of at least 1x1 after the stem works (8x8, 32x32, 224x224).

    Args:
        block: `BasicBlock` (ResNet-18/34) or `Bottleneck` (ResNet-50/101/152).
        layers: number of blocks in layer1..layer4, e.g. (3, 4, 6, 3) for ResNet-50.
        num_classes: size of the `fc` output.
        zero_init_residual: start each residual block as the identity by zeroing its last BN gamma.
        in_channels: channels of the input image (3 for RGB, 1 for grayscale).
        conv_impl: how convolutions run (`trainkit.models.conv.CONV_IMPLS`): `auto` is the fastest measured for
            the device target (im2col + MatMul on CPU, with activations kept (C, N, H, W) where trainkit's C++
            kernels build; MindSpore's kernel elsewhere); parameters are the same.
    """

    def __init__(
        self,
        block: Block,
        layers: Sequence[int],
        num_classes: int = 1000,
        zero_init_residual: bool = False,
        in_channels: int = 3,
        conv_impl: str = "auto",
    ):
        super().__init__()
        if not (isinstance(block, type) and issubclass(block, (BasicBlock, Bottleneck))):
            raise TypeError(f"block must be BasicBlock or Bottleneck (the class); got {block!r}")
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or len(layers) != 4:
            raise TypeError(f"layers must be a sequence of 4 ints >= 1 (blocks in layer1..layer4); got {layers!r}")
        for index, count in enumerate(layers):
            check_int(f"layers[{index}]", count, 1)
        check_int("num_classes", num_classes, 1)
        check_bool("zero_init_residual", zero_init_residual)
        check_int("in_channels", in_channels, 1)
        self._conv_impl = resolve_conv_impl(conv_impl)
        # Activations between layers are (C, N, H, W) (conv_impl channel_major): one transpose in, one out.
        self.channel_major = self._conv_impl == "channel_major"

        self._in_channels = 64
        with _replaced_at_the_end():  # every convolution's weight is drawn by init_like_torchvision below
            self.conv1 = conv2d(in_channels, 64, 7, stride=2, padding=3, conv_impl=self._conv_impl,
                                weight_init=_weight_init())
            self.bn1 = batch_norm2d(64, self._conv_impl)
            self.relu = nn.ReLU()
            # pad_mode="pad" pads with -inf, as torch's MaxPool2d(3, 2, padding=1); nn.Pad would pad with zeros.
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
            self.layer1 = self._make_layer(block, 64, layers[0])
            self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
            self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
            self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.mean = ops.ReduceMean(keep_dims=False)  # same as AdaptiveAvgPool2d(1) + flatten, and faster
        self.fc = nn.Dense(512 * block.expansion, num_classes)
        init_like_torchvision(self, zero_init_residual)

    def _make_layer(self, block: Block, channels: int, blocks: int, stride: int = 1) -> nn.SequentialCell:
        downsample = None
        if stride != 1 or self._in_channels != channels * block.expansion:
            downsample = _downsample(self._in_channels, channels * block.expansion, stride, self._conv_impl)
        cells = [block(self._in_channels, channels, stride, downsample, self._conv_impl)]
        self._in_channels = channels * block.expansion
        cells.extend(block(self._in_channels, channels, conv_impl=self._conv_impl) for _ in range(1, blocks))
        return nn.SequentialCell(cells)

    def construct(self, x):
        if self.channel_major:
            x = x.transpose(1, 0, 2, 3)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        pooled = self.mean(x, (2, 3))  # (N, C), or (C, N) channel-major
        return self.fc(pooled.transpose(1, 0) if self.channel_major else pooled)


def resnet18(*, num_classes: int = 1000, zero_init_residual: bool = False, in_channels: int = 3,
             conv_impl: str = "auto") -> ResNet:
    """ResNet-18: BasicBlock x (2, 2, 2, 2); keyword-only so Hydra configs name every argument."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, zero_init_residual, in_channels, conv_impl)


def resnet34(*, num_classes: int = 1000, zero_init_residual: bool = False, in_channels: int = 3,
             conv_impl: str = "auto") -> ResNet:
    """ResNet-34: BasicBlock x (3, 4, 6, 3); keyword-only so Hydra configs name every argument."""
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes, zero_init_residual, in_channels, conv_impl)


def resnet50(*, num_classes: int = 1000, zero_init_residual: bool = False, in_channels: int = 3,
             conv_impl: str = "auto") -> ResNet:
    """ResNet-50: Bottleneck x (3, 4, 6, 3); keyword-only so Hydra configs name every argument."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, zero_init_residual, in_channels, conv_impl)


def resnet101(*, num_classes: int = 1000, zero_init_residual: bool = False, in_channels: int = 3,
             conv_impl: str = "auto") -> ResNet:
    """ResNet-101: Bottleneck x (3, 4, 23, 3); keyword-only so Hydra configs name every argument."""
    return ResNet(Bottleneck, (3, 4, 23, 3), num_classes, zero_init_residual, in_channels, conv_impl)


def resnet152(*, num_classes: int = 1000, zero_init_residual: bool = False, in_channels: int = 3,
             conv_impl: str = "auto") -> ResNet:
    """ResNet-152: Bottleneck x (3, 8, 36, 3); keyword-only so Hydra configs name every argument."""
    return ResNet(Bottleneck, (3, 8, 36, 3), num_classes, zero_init_residual, in_channels, conv_impl)
