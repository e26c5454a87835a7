"""Modules with non-persistent buffers (``register_buffer(..., persistent=False)``), as timm's Swin has: computed in
``__init__``, absent from the ``state_dict``. Every block holds the same integer index (a relative position index)
and a float mask of its own (a shifted window's), so the port must keep each block's values."""
from __future__ import annotations

import torch
from torch import nn


class BufferedBlock(nn.Module):
    """A bias gathered from a learned table by an index buffer, plus a mask buffer whose first `masked` features
    are -100 (the others a ramp): both non-persistent."""

    def __init__(self, features: int, masked: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, features))
        self.register_buffer("index", torch.tensor([[4, 0], [2, 2], [1, 3]]), persistent=False)
        mask = torch.linspace(0.5, 1.5, features)
        mask[:masked] = -100.0
        self.register_buffer("mask", mask, persistent=False)
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(3, 2, -1).sum(1).mean(0)
        return torch.softmax(self.fc(x) + bias + self.mask, dim=-1)


class NonPersistentBuffers(nn.Module):
    """Two blocks whose masks differ and whose indices are equal, then a linear head."""

    def __init__(self, features: int = 6, num_classes: int = 3):
        super().__init__()
        self.blocks = nn.Sequential(BufferedBlock(features, 1), BufferedBlock(features, 3))
        self.head = nn.Linear(features, num_classes)

    def forward(self, x):
        return self.head(self.blocks(x))


class PositionTable(nn.Module):
    """A table of `length` rows read at the positions 0..length-1, held in a non-persistent buffer: `length` moves
    the top class's layer (the table's rows) and the buffer's values; `num_classes` the layer only."""

    def __init__(self, length: int = 4, num_classes: int = 3):
        super().__init__()
        self.table = nn.Embedding(length, num_classes)
        self.register_buffer("positions", torch.arange(length).flip(0), persistent=False)

    def forward(self, x):
        return x @ self.table(self.positions)


def small_timm_swin() -> nn.Module:
    """timm's Swin in two stages: the first's 8x8 tokens in 4x4 windows, its second block shifted by 2 (a mask buffer
    of its own); the second's 4x4 tokens in one window (no shift, no mask); every block's relative position index
    equal. A factory without arguments: port has none to search (the test stays short)."""
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 2),
                           num_classes=10)
