"""A sequence model: an image read row by row by an LSTM, classified from the last row's hidden state."""
from __future__ import annotations

from mindspore import nn, ops

from trainkit.checks import check_int

__all__ = ["RowLSTM"]


class RowLSTM(nn.Cell):
    """Images ``[batch, channels, rows, row_size]`` as sequences of ``rows`` steps of ``channels * row_size``
    features, through ``num_layers`` LSTM layers of ``hidden_size`` (``mindspore.nn.LSTM``, PyTorch's gate layout
    and parameter names), then a Dense layer on the last step's hidden state.

    Args:
        num_classes: outputs (null in the config: the data's ``num_classes``).
        in_channels: image channels (null: the data's ``image_channels``).
        row_size: pixels per row (the digits: 8).
        hidden_size: the LSTM's width.
        num_layers: stacked LSTM layers.
    """

    def __init__(self, num_classes: int, in_channels: int = 1, row_size: int = 8, hidden_size: int = 64,
                 num_layers: int = 1):
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, 1)
        self.in_channels = check_int("in_channels", in_channels, 1)
        self.row_size = check_int("row_size", row_size, 1)
        hidden_size = check_int("hidden_size", hidden_size, 1)
        num_layers = check_int("num_layers", num_layers, 1)
        # Time-major (batch_first=False): the rows are put first by the one transpose the images need anyway;
        # batch_first makes nn.LSTM transpose its input and its outputs again (Transpose was 8 % of the step).
        self.lstm = nn.LSTM(self.in_channels * self.row_size, hidden_size, num_layers=num_layers)
        self.head = nn.Dense(hidden_size, self.num_classes)

    def construct(self, images):
        batch, channels, rows, width = images.shape
        steps = ops.transpose(images, (2, 0, 1, 3)).reshape(rows, batch, channels * width)  # a row per step
        outputs, _ = self.lstm(steps)
        return self.head(outputs[-1])
