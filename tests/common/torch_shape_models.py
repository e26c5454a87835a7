"""PyTorch models whose forward does arithmetic and branches on its input's shape, written as people write them
(ShuffleNet's channel shuffle, a rank check, a head that pools only large maps, a flag argument with a default),
with the activations and pooling of the CNN families and a Sequential subclass whose children have names."""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's spelling
from torch import nn

from tests.common.torch_port_models import randomised


class Shuffle(nn.Module):
    """Channel shuffle as ShuffleNet writes it: sizes read from x.size(), floordiv, view."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        torch._assert(x.dim() == 4, "expected a 4-d input")
        batch, channels, height, width = x.size()
        per_group = channels // self.groups
        x = x.view(batch, self.groups, per_group, height, width)
        return torch.transpose(x, 1, 2).contiguous().view(batch, -1, height, width)


class Head(nn.Module):
    """Pools to 4x4 only when the map is larger (a branch on the input's size), then to 3x3 (bins of unequal
    sizes), then a flag argument."""

    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d((4, 4))
        self.fc = nn.Linear(channels * 9, classes)

    def forward(self, x, features_only: bool = False):
        if x.shape[-1] > 4:
            x = self.pool(x)
        x = F.adaptive_avg_pool2d(x, (3, 3))
        if features_only:
            return x
        return self.fc(torch.flatten(x, 1))


class ConvAct(nn.Sequential):
    """A Sequential subclass with its own children's names, as torchvision's Conv2dNormActivation."""

    def __init__(self, channels: int):
        super().__init__(OrderedDict([("conv0", nn.Conv2d(3, channels, 3, padding=1)),
                                      ("norm-0", nn.BatchNorm2d(channels)), ("act0", nn.Hardswish())]))


class ShapeNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = ConvAct(8)
        self.gate = nn.Hardsigmoid()
        self.shuffle = Shuffle(2)
        self.head = Head(8, classes)

    def forward(self, x):
        x = F.avg_pool2d(self.stem(x), 3, 1, 1)  # Inception's branch pool (divisor_override None)
        return self.head(self.shuffle(F.relu6(x) * self.gate(x)))


def shape_net() -> nn.Module:
    torch.manual_seed(0)
    return randomised(ShapeNet(), 3)


class DataBranch(nn.Module):
    """Branches on the data (the sum's sign): no trace can hold for every input."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class Block(nn.Module):
    """DLA's block: the shortcut is an argument that defaults to None (`is None` cannot be traced)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x, shortcut=None):
        if shortcut is None:
            shortcut = x
        return F.relu(self.conv(x) + shortcut)


class OptionalShortcut(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x)
