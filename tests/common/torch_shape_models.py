"""PyTorch models whose forward does arithmetic and branches on its input's shape, written as people write them
(ShuffleNet's channel shuffle, a rank check, a head that pools only large maps, a flag argument with a default)."""
from __future__ import annotations

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
    """Pools to 2x2 only when the map is larger (a branch on the input's size), then a flag argument."""

    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d((2, 2))
        self.fc = nn.Linear(channels * 4, classes)

    def forward(self, x, features_only: bool = False):
        if x.shape[-1] > 2:
            x = self.pool(x)
        if features_only:
            return x
        return self.fc(torch.flatten(x, 1))


class ShapeNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.Hardswish()
        self.shuffle = Shuffle(2)
        self.head = Head(8, classes)

    def forward(self, x):
        return self.head(self.shuffle(F.relu6(self.act(self.conv(x)))))


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
