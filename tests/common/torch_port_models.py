"""PyTorch models for the port tests, written as a PyTorch user would (no trainkit names or layouts): a digits CNN
with its own names, dropout and a two-layer head, an LSTM/GRU classifier and a Transformer encoder classifier over
token ids, and a 1-d signal net for the remaining layers and functions. Random weights and batch-norm statistics,
so that a wrong port cannot hide behind default values."""
from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's spelling
from torch import nn

from tests.common.torch_models import BasicBlock, Bottleneck, ResNet


def randomised(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter and batch-norm statistic drawn at random, of order one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                value.fill_(5)
            elif name.endswith("running_var"):
                value.copy_(0.5 + torch.rand(value.shape, generator=generator))
            elif value.is_floating_point():
                scale = (1.0 / value[0].numel()) ** 0.5 if value.dim() > 1 else 0.2
                offset = 1.0 if name.endswith("weight") and value.dim() == 1 else 0.0
                value.copy_(offset + scale * torch.randn(value.shape, generator=generator))
    return model.eval()


class DigitsNet(nn.Module):
    """A digits CNN named its own way, with batch-norm options of its own, dropout and a two-layer head."""

    def __init__(self, num_classes: int = 10, seed: int = 0):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.stem_norm = nn.BatchNorm2d(16, eps=1e-3, momentum=0.2)
        self.block = nn.Sequential(nn.Conv2d(16, 24, 3, stride=2, padding=1), nn.BatchNorm2d(24), nn.GELU(),
                                   nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True))
        self.squeeze = nn.Sequential(nn.AvgPool2d(2, padding=1, ceil_mode=True, count_include_pad=False),
                                     nn.AdaptiveAvgPool2d(1))
        self.drop = nn.Dropout(0.25)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(24, 32), nn.SiLU(), nn.Dropout(0.1),
                                  nn.Linear(32, num_classes))
        randomised(self, seed)

    def forward(self, x):
        x = F.relu(self.stem_norm(self.stem(x)))
        x = self.block(x)
        return self.head(self.drop(self.squeeze(x)))


class SequenceClassifier(nn.Module):
    """Token ids -> an LSTM and a GRU (batch first) -> their last steps side by side -> LayerNorm -> a classifier."""

    def __init__(self, vocab: int = 50, num_classes: int = 4, seed: int = 0):
        super().__init__()
        self.embed = nn.Embedding(vocab, 12)
        self.lstm = nn.LSTM(12, 16, num_layers=2, batch_first=True)
        self.gru = nn.GRU(12, 8, batch_first=True)
        self.norm = nn.LayerNorm(24, eps=1e-6)
        self.classifier = nn.Linear(24, num_classes)
        randomised(self, seed)

    def forward(self, ids):
        x = self.embed(ids)
        steps, _ = self.lstm(x)
        gru_steps, _ = self.gru(x)
        last = torch.cat([steps[:, -1], gru_steps[:, -1]], dim=1)
        return self.classifier(torch.tanh(self.norm(last)))


class TransformerClassifier(nn.Module):
    """Token ids -> an embedding -> two Transformer encoder layers (batch first, GELU) -> mean over steps -> head."""

    def __init__(self, vocab: int = 50, num_classes: int = 4, seed: int = 0):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, num_classes))
        randomised(self, seed)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))


class SignalBlock(nn.Module):
    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, stride=stride, padding=1, bias=False)
        self.norm = nn.GroupNorm(2, channels)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.act(self.norm(self.conv(x))) + x[:, :, ::self.conv.stride[0]]


class SignalNet(nn.Module):
    """1-d signals: Conv1d, BatchNorm1d, GroupNorm, pooling, attention by matmul and softmax, views and permutes."""

    def __init__(self, channels: int = 2, num_classes: int = 3, seed: int = 0):
        super().__init__()
        self.conv = nn.Conv1d(channels, 8, 5, padding=2)
        self.norm = nn.BatchNorm1d(8)
        self.blocks = nn.ModuleList([SignalBlock(8, 1), SignalBlock(8, 2)])
        self.pool = nn.MaxPool1d(2)
        self.score = nn.Linear(8, 8)
        self.mix = nn.Identity()
        self.out = nn.Sequential(nn.Linear(8, num_classes), nn.Sigmoid())
        randomised(self, seed)

    def forward(self, x):
        x = torch.sigmoid(self.norm(self.conv(x)))
        for block in self.blocks:
            x = block(x)
        x = self.pool(x)                                # (batch, 8, steps)
        steps = x.permute(0, 2, 1)                      # (batch, steps, 8)
        weights = F.softmax(torch.matmul(self.score(steps), steps.transpose(1, 2)) * 0.5, dim=-1)
        mixed = self.mix(torch.matmul(weights, steps))  # (batch, steps, 8)
        pooled = mixed.reshape(x.size(0), -1, 8).mean(1)
        return self.out(pooled.view(-1, 8)) * 2.0


def resnet18(num_classes: int = 10, in_channels: int = 3, seed: int = 0) -> nn.Module:
    """torchvision's ResNet-18 layout (tests.common.torch_models), random throughout."""
    return randomised(ResNet(BasicBlock, (2, 2, 2, 2), num_classes, in_channels), seed)


def resnet50(num_classes: int = 10, in_channels: int = 3, seed: int = 0) -> nn.Module:
    return randomised(ResNet(Bottleneck, (3, 4, 6, 3), num_classes, in_channels), seed)
