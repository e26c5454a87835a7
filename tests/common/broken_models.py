"""A network that runs eagerly (so it passes the pre-compile fit check) but fails to compile in graph mode: graph
mode's JIT Fallback cannot turn a Tensor into a Python object with asnumpy(). For the crash tests."""
from mindspore import nn, ops


class NotCompilable(nn.Cell):
    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.dense = nn.Dense(in_channels, num_classes)

    def construct(self, x):
        scale = float(x.asnumpy().std()) if self.training else 1.0
        return self.dense(ops.mean(x, (2, 3))) * scale
