"""A network that fails to compile in graph mode (it reads an attribute it does not have), for the crash tests."""
from mindspore import nn, ops


class NotCompilable(nn.Cell):
    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.dense = nn.Dense(in_channels, num_classes)

    def construct(self, x):
        return self.dense(ops.mean(x, (2, 3))) + self.undefined_attribute
