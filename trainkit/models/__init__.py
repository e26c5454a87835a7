"""Networks trainkit ships: the ResNet family (torchvision layout), a small CNN, and a Dropout a resume continues.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import ``kernels`` and the
foundation (``checks``, ``process``, ``errors``); not ``step``, ``data`` or ``parts`` (no part imports another), nor
any wing above.
"""
from trainkit.models.dropout import Dropout
from trainkit.models.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50, resnet101, resnet152
from trainkit.models.small_cnn import SmallCNN

__all__ = [
    "BasicBlock",
    "Bottleneck",
    "Dropout",
    "ResNet",
    "SmallCNN",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]
