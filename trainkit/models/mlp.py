"""A multilayer perceptron for tabular data: Dense -> ReLU blocks, then a Dense output layer."""
from __future__ import annotations

from typing import Sequence

from mindspore import nn

from trainkit.checks import check_int, check_number
from trainkit.models.dropout import Dropout

__all__ = ["MLP"]


class MLP(nn.Cell):
    """``in_features`` -> each of ``hidden_sizes`` (Dense, ReLU, optional dropout) -> ``out_features``.

    Args:
        in_features: input width (null in the config: the data's ``in_features``).
        out_features: outputs: the logits of each class, or 1 for one regression target (null: the data's
            ``out_features``).
        hidden_sizes: widths of the hidden layers; empty for a linear model.
        dropout: dropout probability after each hidden layer, in [0, 1); 0: none. The layers are
            :class:`trainkit.models.dropout.Dropout`, whose masks a resume continues exactly.
    """

    def __init__(self, in_features: int, out_features: int, hidden_sizes: Sequence[int] = (64,),
                 dropout: float = 0.0):
        super().__init__()
        in_features = check_int("in_features", in_features, 1)
        out_features = check_int("out_features", out_features, 1)
        dropout = float(check_number("dropout", dropout, "a number in [0, 1)", lambda v: 0 <= v < 1))
        layers = []
        width = in_features
        for index, size in enumerate(hidden_sizes):
            size = check_int(f"hidden_sizes[{index}]", size, 1)
            layers += [nn.Dense(width, size), nn.ReLU()]
            if dropout > 0:
                layers.append(Dropout(p=dropout))  # trainkit's: its random stream resumes exactly
            width = size
        layers.append(nn.Dense(width, out_features))
        self.in_features, self.out_features = in_features, out_features
        self.layers = nn.SequentialCell(layers)

    def construct(self, x):
        return self.layers(x)
