"""The project's model: any ``nn.Cell`` mapping a batch of images to logits."""
from mindspore import nn


class LineNet(nn.Cell):
    """Two convolutions and a linear classifier; `num_classes` and `in_channels` come from the data when null."""

    def __init__(self, num_classes: int, in_channels: int, width: int = 8):
        super().__init__()
        self.features = nn.SequentialCell(
            nn.Conv2d(in_channels, width, 3, pad_mode="same"), nn.ReLU(),
            nn.Conv2d(width, width, 3, pad_mode="same"), nn.ReLU(),
            nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten())
        self.classifier = nn.Dense(width * 4, num_classes)

    def construct(self, images):
        return self.classifier(self.features(images))
