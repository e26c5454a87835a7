"""python -m trainkit.port on non-persistent buffers (``register_buffer(..., persistent=False)``, timm's Swin index
and masks): their values come with the port, an index stays integer, and the ported Cell computes what PyTorch
computes while its checkpoints keep the state_dict's keys."""
import importlib

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.common import torch_buffer_models  # noqa: E402
from trainkit.bridge.export_torch import export_torch  # noqa: E402
from trainkit.bridge.port import main  # noqa: E402

TARGET = "tests.common.torch_buffer_models:NonPersistentBuffers"


def ported(folder):
    """The ported Cell, built afresh (its buffers from buffers.npz) with weights.ckpt loaded strictly."""
    network = importlib.import_module(f"{folder.name}.model").NonPersistentBuffers()
    ms.load_param_into_net(network, ms.load_checkpoint(str(folder / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    return network


def torch_forward(model, batch):
    with torch.no_grad():
        return model(torch.from_numpy(batch)).numpy()


def test_non_persistent_buffers_are_saved_beside_the_port_an_index_as_integers(on_path, capsys):
    """Port agrees with PyTorch (exit 0); buffers.npz holds the index once, as int64 (equal in both blocks), and
    each block's mask as its own. Mutations caught: the buffers' values
    dropped (zeros saved: the outputs differ, port exits 1), the index saved as float32 (its dtype), every block
    reading the first block's mask (the second block's differs)."""
    assert main([TARGET, "--out", str(on_path / "buffered"), "--input-shape", "6"]) == 0, capsys.readouterr().out
    with np.load(on_path / "buffered" / "buffers.npz") as saved:
        buffers = {name: saved[name] for name in saved.files}
    assert sorted(buffers) == ["blocks.0.index", "blocks.0.mask", "blocks.1.mask"]
    assert buffers["blocks.0.index"].dtype == np.int64
    np.testing.assert_array_equal(buffers["blocks.0.index"], [[4, 0], [2, 2], [1, 3]])
    for block, masked in enumerate((1, 3)):  # the test's own arithmetic of BufferedBlock's mask
        mask = np.linspace(0.5, 1.5, 6, dtype=np.float32)
        mask[:masked] = -100.0
        np.testing.assert_allclose(buffers[f"blocks.{block}.mask"], mask, rtol=1e-6)


def test_the_ported_cell_agrees_its_buffers_are_no_parameters_and_it_goes_back_to_pytorch_strictly(on_path, capsys):
    """Built afresh, the Cell gives PyTorch's forward on another batch; its parameters are the state_dict's (the
    buffers are no Parameters: no gradient, no optimizer state, in no checkpoint); a checkpoint of it exported with
    ``export --to torch`` loads into PyTorch's model with strict=True and gives the same outputs. Mutations caught:
    the buffers as Parameters with requires_grad=False (an extra key: PyTorch's strict load refuses it), the
    buffers' values dropped (the outputs differ)."""
    model = torch_buffer_models.NonPersistentBuffers().eval()
    torch.manual_seed(1)
    for parameter in model.parameters():  # weights of the test's own: port reads them from --weights
        torch.nn.init.normal_(parameter)
    torch.save(model.state_dict(), on_path / "buffered.pth")
    assert main([TARGET, "--out", str(on_path / "buffered"), "--input-shape", "6", "--weights",
                 str(on_path / "buffered.pth")]) == 0, capsys.readouterr().out
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = ported(on_path / "buffered")
    assert {parameter.name for parameter in network.get_parameters()} == set(model.state_dict())
    batch = np.random.default_rng(7).normal(0, 1, (5, 6)).astype(np.float32)
    expected = torch_forward(model, batch)
    np.testing.assert_allclose(network(ms.Tensor(batch)).asnumpy(), expected, rtol=1e-5, atol=1e-6)

    ms.save_checkpoint(network, str(on_path / "network.ckpt"))
    export_torch(on_path / "network.ckpt", on_path / "back.pth")
    again = torch_buffer_models.NonPersistentBuffers().eval()
    again.load_state_dict(torch.load(on_path / "back.pth", weights_only=True), strict=True)
    np.testing.assert_allclose(torch_forward(again, batch), expected, rtol=1e-6, atol=1e-7)
