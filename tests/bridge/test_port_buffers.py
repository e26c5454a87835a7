"""python -m trainkit.port on non-persistent buffers (``register_buffer(..., persistent=False)``, timm's Swin index
and masks): their values come with the port, an index stays integer, and the ported Cell computes what PyTorch
computes, trains and resumes without them, and its checkpoints keep the state_dict's keys."""
import importlib

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.bridge.test_port import expected_names  # noqa: E402
from tests.bridge.test_port_transformers import parameters  # noqa: E402
from tests.common import torch_buffer_models  # noqa: E402
from tests.common.port_data import train_ported  # noqa: E402
from tests.common.torch_zoo import import_zoo  # noqa: E402
from trainkit.bridge.export_torch import export_torch  # noqa: E402
from trainkit.bridge.port import main, port  # noqa: E402
from trainkit.models.dropout import Dropout, DropPath  # noqa: E402

TARGET = "tests.common.torch_buffer_models:NonPersistentBuffers"


def port_buffered(folder):
    """NonPersistentBuffers with weights of the test's own (normal, not PyTorch's init) ported into `folder`; the
    PyTorch model."""
    model = torch_buffer_models.NonPersistentBuffers().eval()
    torch.manual_seed(1)
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter)
    torch.save(model.state_dict(), folder.parent / "buffered.pth")
    assert main([TARGET, "--out", str(folder), "--input-shape", "6", "--weights", str(folder.parent / "buffered.pth")
                 ]) == 0
    return model


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
    each block's mask as its own. Mutations caught: the buffers' values dropped (zeros saved: port exits 1), the
    index saved as float32 (port exits 1), every block reading the first block's mask (port exits 1)."""
    assert main([TARGET, "--out", str(on_path / "buffered"), "--input-shape", "6"]) == 0, capsys.readouterr().out
    with np.load(on_path / "buffered" / "buffers.npz") as saved:
        buffers = {name: saved[name] for name in saved.files}
    assert sorted(buffers) == ["blocks.0.index", "blocks.0.mask", "blocks.1.mask"]
    source = (on_path / "buffered" / "model.py").read_text()
    assert "self.index = buffer(name='blocks.0.index')" in source and "self.mask = buffer(name=mask_name)" in source
    assert buffers["blocks.0.index"].dtype == np.int64
    np.testing.assert_array_equal(buffers["blocks.0.index"], [[4, 0], [2, 2], [1, 3]])
    for block, masked in enumerate((1, 3)):  # the test's own arithmetic of BufferedBlock's mask
        mask = np.linspace(0.5, 1.5, 6, dtype=np.float32)
        mask[:masked] = -100.0
        np.testing.assert_allclose(buffers[f"blocks.{block}.mask"], mask, rtol=1e-6)


def test_the_ported_cell_agrees_its_buffers_are_no_parameters_and_it_goes_back_to_pytorch_strictly(on_path):
    """Built afresh, the Cell gives PyTorch's forward on another batch; its parameters are the state_dict's (the
    buffers are no Parameters: no gradient, no optimizer state, in no checkpoint); a checkpoint of it exported with
    ``export --to torch`` loads into PyTorch's model with strict=True and gives the same outputs. Mutations caught:
    the buffers as Parameters with requires_grad=False, port letting the weights lack them (extra names: the
    names differ), the buffers' values dropped (port exits 1)."""
    model = port_buffered(on_path / "buffered")
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


class WeightedLoss(ms.nn.Cell):
    """The network's outputs weighted and summed: a scalar whose gradient reaches every parameter."""

    def __init__(self, network, weights):
        super().__init__()
        self.network, self.weights = network, ms.Tensor(weights)

    def construct(self, x):
        return (self.network(x) * self.weights).sum()


def test_in_graph_mode_the_gradients_are_pytorch_s_and_a_step_leaves_the_buffers_as_they_were(on_path, graph_mode):
    """Compiled (the buffers constants of the graph), the gradient of a weighted sum of the outputs with respect
    to every trainable parameter is PyTorch's; an SGD step moves every parameter and leaves the buffers as PyTorch
    computed them. Mutation caught: the buffers' values dropped (port exits 1)."""
    model = port_buffered(on_path / "buffered")
    network = ported(on_path / "buffered")
    batch = np.random.default_rng(7).normal(0, 1, (5, 6)).astype(np.float32)
    weights = np.random.default_rng(8).normal(0, 1, (5, 3)).astype(np.float32)
    (model(torch.from_numpy(batch)) * torch.from_numpy(weights)).sum().backward()
    loss = WeightedLoss(network, weights)
    trainable = network.trainable_params()
    gradients = ms.grad(loss, grad_position=None, weights=trainable)(ms.Tensor(batch))
    expected = dict(model.named_parameters())
    names = [parameter.name.removeprefix("network.") for parameter in trainable]  # the loss Cell's prefix
    assert sorted(names) == sorted(expected)
    for name, gradient in zip(names, gradients):
        np.testing.assert_allclose(gradient.asnumpy(), expected[name].grad.numpy(), rtol=1e-4, atol=1e-5)

    before = parameters(network)
    step = ms.nn.TrainOneStepCell(loss, ms.nn.SGD(trainable, 0.1))
    network.set_train(True)
    step(ms.Tensor(batch))
    assert all(not np.array_equal(parameter.asnumpy(), before[parameter.name]) for parameter in trainable)
    for block, torch_block in zip(network.blocks, model.blocks):
        np.testing.assert_array_equal(block.index.asnumpy(), torch_block.index.numpy())
        np.testing.assert_array_equal(block.mask.asnumpy(), torch_block.mask.numpy())


@pytest.mark.slow  # the buffers are no Parameters: the fast tests above
def test_a_ported_model_with_buffers_trains_and_resumes_bitwise_in_the_app(on_path, graph_mode):
    """Trained in the app 2 epochs of 2 steps with AdamW: a run resumed from the checkpoint at epoch 2 step 1 ends
    bitwise equal to the uninterrupted one, and no checkpoint holds a buffer (nor optimizer moments of one).
    Mutation caught: the buffers as Parameters with requires_grad=False, port letting the weights lack them (the
    checkpoint holds them, and their EMA copies)."""
    folder = on_path / "buffered"
    port_buffered(folder)
    data = folder / "conf" / "data" / "random.yaml"
    data.parent.mkdir()
    data.write_text("_target_: tests.common.port_data.RandomSamples\nshape: [6]\nnum_classes: 3\nsamples: 8\n")

    def run(name, *extra):
        return train_ported(folder, "buffered", on_path / name, *extra)

    first = parameters(run("a").wrapper)
    checkpoint = on_path / "a" / "checkpoints" / "trainkit-2_1.ckpt"
    resumed = parameters(run("b", f"trainer.resume={checkpoint}").wrapper)
    assert sorted(resumed) == sorted(first)
    assert not [name for name in first if not np.array_equal(resumed[name], first[name])]
    saved = list(ms.load_checkpoint(str(checkpoint)))
    assert not [name for name in saved if name.endswith((".index", ".mask"))]
    assert [name for name in saved if name.endswith("blocks.1.fc.weight")]  # the names are the network's


def ports_and_agrees(target, arguments, shape, folder, capsys):
    """`target` (timm's SwinTransformer) with `arguments`, its weights random, ported into `folder`: the ported
    Cell, built afresh, gives PyTorch's forward on a batch port never saw; its parameters are the state_dict's.
    The names of the non-persistent buffers."""
    import_zoo()
    module, _, factory = target.partition(":")
    torch.manual_seed(0)
    model = getattr(importlib.import_module(module), factory)(**arguments).eval()
    torch.save(model.state_dict(), folder.parent / "swin.pth")
    assert port(target, arguments, folder, list(shape), weights=folder.parent / "swin.pth") == 0, \
        capsys.readouterr().out
    network = importlib.import_module(f"{folder.name}.model").SwinTransformer()
    ms.load_param_into_net(network, ms.load_checkpoint(str(folder / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    unsaved = set(dict(model.named_buffers())) - set(model.state_dict())
    counters = {parameter.name for _, cell in network.cells_and_names() if isinstance(cell, (Dropout, DropPath))
                for parameter in cell.get_parameters(expand=False)}  # trainkit's random layers' call counters
    names = {parameter.name for parameter in network.get_parameters()} - counters
    assert names == expected_names(model) - unsaved
    batch = np.random.default_rng(7).normal(0, 1, (2, *shape)).astype(np.float32)
    expected = torch_forward(model, batch)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    assert np.max(np.abs(network(ms.Tensor(batch)).asnumpy() - expected)) <= 1e-4 * np.max(np.abs(expected))
    return unsaved


def test_a_small_timm_swin_ports_and_computes_what_pytorch_computes(on_path, capsys):
    """timm's Swin, two stages: its relative position indices and the shifted block's mask are non-persistent.
    Mutation caught: the buffers' values dropped (port exits 1)."""
    unsaved = ports_and_agrees("tests.common.torch_buffer_models:small_timm_swin", {}, (3, 32, 32),
                               on_path / "small_swin", capsys)
    assert sorted(name.rsplit(".", 1)[1] for name in unsaved) == ["attn_mask"] + ["relative_position_index"] * 4


@pytest.mark.slow
def test_timm_swin_tiny_ports_and_computes_what_pytorch_computes(on_path, capsys):
    """swin_tiny_patch4_window7_224's architecture (the zoo table's row) at 224x224: 12 indices and 5 masks (one
    per shifted block of the first three stages; the last stage's 7x7 tokens fill one window, unshifted)."""
    arguments = {"patch_size": 4, "window_size": 7, "embed_dim": 96, "depths": (2, 2, 6, 2),
                 "num_heads": (3, 6, 12, 24), "num_classes": 10}
    unsaved = ports_and_agrees("timm.models.swin_transformer:SwinTransformer", arguments, (3, 224, 224),
                               on_path / "swin_tiny", capsys)
    assert sorted(name.rsplit(".", 1)[1] for name in unsaved) == ["attn_mask"] * 5 + ["relative_position_index"] * 12


def test_an_argument_that_moves_a_buffer_s_values_stays_a_number(on_path, capsys):
    """A constructor argument moving a non-persistent buffer (``length``: ``torch.arange(length)``) is not made an
    argument of the top class, whose buffer comes from buffers.npz as it was ported; one moving the layers only
    (``num_classes``) is. Mutation caught: the buffers left out of the comparison of the rebuilt model (length=5
    would build a 5-row table read at 4 positions)."""
    assert main(["tests.common.torch_buffer_models:PositionTable", "--out", str(on_path / "positions"),
                 "--input-shape", "4"]) == 0, capsys.readouterr().out
    config = (on_path / "positions" / "conf" / "model" / "positions.yaml").read_text()
    assert "num_classes: 3" in config and "length" not in config
    assert "def __init__(self, num_classes=3):" in (on_path / "positions" / "model.py").read_text()
