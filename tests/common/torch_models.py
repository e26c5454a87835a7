"""PyTorch models for the conversion tests: torchvision's ResNet layout written out here (no torchvision), and a
user's MLP whose names need a mapping file. Weights and batch-norm statistics are random so that a wrong mapping
cannot hide behind default values (gamma 1, beta 0, mean 0, variance 1)."""
from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=10, in_channels=3):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes=10, seed=0):
    return randomised(ResNet(BasicBlock, (2, 2, 2, 2), num_classes), seed)


def resnet50(num_classes=10, seed=0):
    return randomised(ResNet(Bottleneck, (3, 4, 6, 3), num_classes), seed)


class UserMLP(nn.Module):
    """A user's model named differently from tests.common.user_project.UserMLP (body.0 / body.2 there)."""

    def __init__(self, num_classes=3, hidden=16, seed=0):
        super().__init__()
        self.encoder = nn.Linear(4, hidden)
        self.act = nn.ReLU()
        self.classifier = nn.Linear(hidden, num_classes)
        randomised(self, seed)

    def forward(self, x):
        return self.classifier(self.act(self.encoder(x)))


def randomised(model: nn.Module, seed: int) -> nn.Module:
    """Random weights everywhere, batch-norm statistics included, scaled so activations stay of order one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                count = module.num_features
                module.weight.copy_(0.5 + torch.rand(count, generator=generator))
                module.bias.copy_(0.2 * torch.randn(count, generator=generator))
                module.running_mean.copy_(0.1 * torch.randn(count, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(count, generator=generator))
                module.num_batches_tracked.fill_(7)
            elif isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * (1.0 / fan_in) ** 0.5)
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
    return model.eval()
