"""ResNet-50 (torchvision's layout, v1.5) in PyTorch for rows 6 and 9; imported only when torch is installed."""
from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        out = channels * self.expansion
        self.conv1 = nn.Conv2d(in_channels, channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, in_channels = [], 64
        for channels, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for index in range(blocks):
                layers.append(Bottleneck(in_channels, channels, stride if index == 0 else 1))
                in_channels = channels * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


class EagerStep:
    """One SGD-momentum training step of the torch ResNet-50 on a fixed batch, as a user would write it."""

    def __init__(self, batch: int, image: int, threads: int, seed: int = 0):
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.model = ResNet50().train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(batch, 3, image, image, generator=generator)
        self.labels = torch.arange(batch) % 10

    def step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.model(self.images), self.labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()
