"""Tiny networks and data for the tests, with weights set from NumPy so a reference can start equal."""
from __future__ import annotations

from typing import Dict, List, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

IN_FEATURES, HIDDEN, CLASSES = 4, 8, 3


class TinyMLP(nn.Cell):
    """Dense(4, 8) -> [BatchNorm1d] -> Tanh -> Dense(8, 3)."""

    def __init__(self, batch_norm: bool = False, seed: int = 0):
        super().__init__()
        self.fc1 = nn.Dense(IN_FEATURES, HIDDEN)
        self.bn = nn.BatchNorm1d(HIDDEN, momentum=0.7) if batch_norm else None
        self.act = nn.Tanh()
        self.fc2 = nn.Dense(HIDDEN, CLASSES)
        for name, value in initial_weights(seed).items():
            self.parameters_dict()[name].set_data(Tensor(value))

    def construct(self, x):
        x = self.fc1(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.fc2(self.act(x))


def initial_weights(seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.RandomState(seed)
    return {
        "fc1.weight": (rng.randn(HIDDEN, IN_FEATURES) * 0.3).astype(np.float32),
        "fc1.bias": (rng.randn(HIDDEN) * 0.1).astype(np.float32),
        "fc2.weight": (rng.randn(CLASSES, HIDDEN) * 0.5).astype(np.float32),
        "fc2.bias": (rng.randn(CLASSES) * 0.1).astype(np.float32),
    }


def loss_network(net: nn.Cell) -> nn.Cell:
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def batches(count: int, batch_size: int, seed: int = 1) -> List[Tuple[np.ndarray, np.ndarray]]:
    """`count` random (x float32 [batch, 4], y int32 [batch]) micro-batches."""
    rng = np.random.RandomState(seed)
    return [
        (rng.randn(batch_size, IN_FEATURES).astype(np.float32), rng.randint(0, CLASSES, batch_size).astype(np.int32))
        for _ in range(count)
    ]


def run(wrapper: nn.Cell, data) -> List[tuple]:
    """Call the wrapper on each (x, y); return each call's outputs as NumPy."""
    wrapper.set_train()
    return [tuple(o.asnumpy() for o in wrapper(Tensor(x), Tensor(y, ms.int32))) for x, y in data]


def weights_of(net: nn.Cell) -> Dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


class LinearLoss(nn.Cell):
    """loss = sum(x @ w) for a weight w of shape [1, 4]: its gradient with respect to w is the batch's sum of x,
    so a test can make gradients (and the loss) exactly as large as it needs."""

    def __init__(self, weight: np.ndarray):
        super().__init__()
        self.dense = nn.Dense(IN_FEATURES, 1, has_bias=False, weight_init=Tensor(np.asarray(weight, np.float32)))

    def construct(self, x):
        return self.dense(x).sum()



class GeluDigits(nn.Cell):
    """MaxPool2d(3, 2, padding 1) -> Flatten -> Dense(in_channels * 16, width) -> exact GELU -> Dense(width,
    num_classes): a network of the layers `model.layer_impl` swaps, for the 8x8 digits (takes the small CNN
    config's keys)."""

    def __init__(self, num_classes: int, in_channels: int, width: int = 16, num_downsamples: int = 2,
                 stem_stride: int = 1):
        super().__init__()
        self.pool = nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(in_channels * 16, width)
        self.act = nn.GELU(approximate=False)
        self.fc2 = nn.Dense(width, num_classes)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(self.flatten(self.pool(x)))))
