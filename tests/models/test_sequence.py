"""RowLSTM against an LSTM written here in NumPy (PyTorch's equations and gate order: input, forget, cell, output)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

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


class Weighted(nn.Cell):
    """sum(network(x) * cotangent): its gradient is the vector-Jacobian product with `cotangent`."""

    def __init__(self, network, cotangent):
        super().__init__()
        self.network = network
        self.cotangent = cotangent

    def construct(self, x):
        return (self.network(x) * self.cotangent).sum()


@pytest.mark.parametrize("num_layers", [1, 2])
def test_row_lstm_outputs_and_gradients_match_pytorch_on_the_same_weights(mode, num_layers):
    """PyTorch's nn.LSTM (batch first) and nn.Linear, given RowLSTM's Parameters by name (what a ported state dict
    holds), compute the same logits and the same gradient for every Parameter, within float32 tolerance.
    Mutations caught: the rows taken in another order (transpose (2, 0, 3, 1)); the head on the first step's output
    (``outputs[0]``)."""
    torch = pytest.importorskip("torch")
    ms.set_seed(0)
    model = RowLSTM(num_classes=5, in_channels=2, row_size=6, hidden_size=7, num_layers=num_layers)
    rng = np.random.default_rng(2)
    images = rng.standard_normal((3, 2, 4, 6)).astype(np.float32)
    cotangent = rng.standard_normal((3, 5)).astype(np.float32)

    class TorchRowLSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(12, 7, num_layers=num_layers, batch_first=True)
            self.head = torch.nn.Linear(7, 5)

        def forward(self, x):
            steps = x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)  # row r: its channels side by side
            outputs, _ = self.lstm(steps)
            return self.head(outputs[:, -1])

    peer = TorchRowLSTM()
    weights = {p.name: p.asnumpy() for p in model.trainable_params()}
    assert sorted(weights) == sorted(name for name, _ in peer.named_parameters())
    peer.load_state_dict({name: torch.from_numpy(value.copy()) for name, value in weights.items()})
    images_t = torch.from_numpy(images)
    logits_t = peer(images_t)
    (logits_t * torch.from_numpy(cotangent)).sum().backward()

    logits = model(Tensor(images))
    np.testing.assert_allclose(logits.asnumpy(), logits_t.detach().numpy(), rtol=1e-5, atol=1e-5)
    params = model.trainable_params()
    names = [param.name for param in params]  # before Weighted prefixes them with its attribute's name
    grads = ms.grad(Weighted(model, Tensor(cotangent)), grad_position=None, weights=params)(Tensor(images))
    torch_grads = dict(peer.named_parameters())
    for name, grad in zip(names, grads):
        np.testing.assert_allclose(grad.asnumpy(), torch_grads[name].grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
