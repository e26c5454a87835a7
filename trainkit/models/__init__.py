"""Networks trainkit ships: the ResNet family (torchvision layout) and a small CNN."""
