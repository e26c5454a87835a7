"""Networks trainkit ships: the ResNet family (torchvision layout) and a small CNN."""
from trainkit.models.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50, resnet101, resnet152
from trainkit.models.small_cnn import SmallCNN

__all__ = [
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "SmallCNN",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]
