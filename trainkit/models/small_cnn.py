"""A small CNN for the quick start: trains on scikit-learn's 8x8 digits in seconds on a CPU.

MindSpore's 3x3 convolution is slow on CPU (about 1.5 GFLOP/s), so the network keeps its FLOPs small: few channels
and stride-2 convs that halve the resolution early. Global average pooling lets it take any input size (1x8x8
digits, 3x32x32 CIFAR images).
"""
from __future__ import annotations

from mindspore import nn, ops

from trainkit.checks import check_int
from trainkit.models.conv import batch_norm2d, conv2d, resolve_conv_impl
from trainkit.models.resnet import init_like_torchvision

__all__ = ["SmallCNN"]



class ConvBNReLU(nn.SequentialCell):
    """3x3 conv (torch-style explicit padding 1, no bias: BN follows) -> BatchNorm -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, conv_impl: str = "native"):
        super().__init__([
            conv2d(in_channels, out_channels, 3, stride=stride, padding=1, conv_impl=conv_impl),
            batch_norm2d(out_channels, conv_impl),
            nn.ReLU(),
        ])


class SmallCNN(nn.Cell):
    """Stem conv, then `num_downsamples` stride-2 convs each doubling the channels, global mean, `fc`.

    With the defaults on 1x8x8 digits: 8x8x16 -> 4x4x32 -> 2x2x64 -> 64 -> num_classes (about 24k parameters).

    Args:
        num_classes: size of the output logits.
        in_channels: channels of the input image (1 for grayscale digits, 3 for RGB).
        width: channels of the stem; each downsampling stage doubles them.
        num_downsamples: stride-2 stages after the stem; each halves H and W (8x8 inputs allow up to 3).
        stem_stride: 1 keeps the full resolution for tiny images; 2 halves it at once, cutting the FLOPs of
            everything after by 4 for larger images such as 32x32.
        conv_impl: how convolutions run (`trainkit.models.conv.CONV_IMPLS`): `auto` is the fastest measured for
            the device target; parameters are the same whichever runs.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        width: int = 16,
        num_downsamples: int = 2,
        stem_stride: int = 1,
        conv_impl: str = "auto",
    ):
        super().__init__()
        check_int("num_classes", num_classes, 1)
        check_int("in_channels", in_channels, 1)
        check_int("width", width, 1)
        check_int("num_downsamples", num_downsamples, 0)
        check_int("stem_stride", stem_stride, 1)
        if stem_stride > 2:
            raise ValueError(f"stem_stride must be 1 or 2; got {stem_stride!r}")

        conv_impl = resolve_conv_impl(conv_impl)
        self.channel_major = conv_impl == "channel_major"  # activations (C, N, H, W) between layers
        stages = [ConvBNReLU(in_channels, width, stem_stride, conv_impl)]
        channels = width
        for _ in range(num_downsamples):
            stages.append(ConvBNReLU(channels, channels * 2, 2, conv_impl))
            channels *= 2
        self.features = nn.SequentialCell(stages)
        self.mean = ops.ReduceMean(keep_dims=False)
        self.fc = nn.Dense(channels, num_classes)
        init_like_torchvision(self)

    def construct(self, x):
        if self.channel_major:
            pooled = self.mean(self.features(x.transpose(1, 0, 2, 3)), (2, 3)).transpose(1, 0)
        else:
            pooled = self.mean(self.features(x), (2, 3))
        return self.fc(pooled)
