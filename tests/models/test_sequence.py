"""RowLSTM against an LSTM written here in NumPy (PyTorch's equations and gate order: input, forget, cell, output)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from trainkit.errors import ConfigError
from trainkit.models.sequence import RowLSTM


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(steps: np.ndarray, layers: list) -> np.ndarray:
    """`steps` [batch, time, features] through LSTM layers given as (w_ih, w_hh, b_ih, b_hh); the last outputs."""
    sequence = steps.astype(np.float64)
    for w_ih, w_hh, b_ih, b_hh in layers:
        hidden = w_hh.shape[1]
        h = np.zeros((sequence.shape[0], hidden))
        c = np.zeros((sequence.shape[0], hidden))
        outputs = []
        for t in range(sequence.shape[1]):
            gates = sequence[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
            i, f, g, o = np.split(gates, 4, axis=1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            outputs.append(h)
        sequence = np.stack(outputs, axis=1)
    return sequence


@pytest.mark.parametrize("channels, num_layers", [(1, 1), (2, 2)])
def test_row_lstm_reads_rows_as_steps_and_classifies_the_last_state(mode, channels, num_layers):
    ms.set_seed(0)
    model = RowLSTM(num_classes=5, in_channels=channels, row_size=6, hidden_size=7, num_layers=num_layers)
    images = np.random.default_rng(1).standard_normal((3, channels, 4, 6)).astype(np.float32) * 0.5
    params = {p.name: p.asnumpy().astype(np.float64) for p in model.get_parameters()}
    layers = [tuple(params[f"lstm.{kind}_l{k}"] for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
              for k in range(num_layers)]
    steps = images.transpose(0, 2, 1, 3).reshape(3, 4, channels * 6)  # row r: its channels' pixels side by side
    expected = numpy_lstm(steps, layers)[:, -1] @ params["head.weight"].T + params["head.bias"]
    np.testing.assert_allclose(model(Tensor(images)).asnumpy(), expected, rtol=1e-5, atol=1e-5)


def test_row_lstm_arguments_are_checked():
    with pytest.raises(ConfigError, match="hidden_size must be an int >= 1; got 0"):
        RowLSTM(num_classes=3, hidden_size=0)
