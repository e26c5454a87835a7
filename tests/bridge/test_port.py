"""python -m trainkit.port: PyTorch models written in PyTorch become MindSpore Cells that compute what PyTorch
computes (checked here against PyTorch itself, on a batch port never saw), keep the state_dict's names, and train
in the app; anything unsupported stops it before anything is written."""
import importlib
import shutil
import sys

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.common import torch_port_models  # noqa: E402
from trainkit.app import train  # noqa: E402
from trainkit.app.config import compose_config  # noqa: E402
from trainkit.bridge.port import main  # noqa: E402
from trainkit.models.dropout import Dropout  # noqa: E402

MODELS = "tests.common.torch_port_models"
# name: (factory, one sample's shape, token vocabulary or None)
CASES = {
    "digits_net": ("DigitsNet", (1, 8, 8), None),
    "sequence": ("SequenceClassifier", (10,), 50),
    "transformer": ("TransformerClassifier", (10,), 50),
    "torch_resnet18": ("resnet18", (3, 16, 16), None),
    "signal_net": ("SignalNet", (2, 16), None),  # not "signal": the standard library has that name
}
# Norm layers' PyTorch names, renamed as trainkit's MindSpore layers call them (the test's own table).
NORM_RENAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}


def port(name, folder, *extra):
    factory, shape, vocab = CASES[name]
    argv = [f"{MODELS}:{factory}", "--out", str(folder / name), "--input-shape", ",".join(map(str, shape)), *extra]
    return main(argv + (["--input-ints", str(vocab)] if vocab else []))


def expected_names(model):
    """The state_dict's names, a norm layer's renamed, batch norm's step counter left out."""
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)
    names = set()
    for module_name, module in model.named_modules():
        for leaf, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if leaf == "num_batches_tracked":
                continue
            leaf = NORM_RENAMES[leaf] if isinstance(module, norms) else leaf
            names.add(f"{module_name}.{leaf}" if module_name else leaf)
    return names


def dropout_counters(network):
    """The call counters of trainkit's Dropout layers, which the port writes for PyTorch's (not in its weights)."""
    return {p.name for _, cell in network.cells_and_names() if isinstance(cell, Dropout)
            for p in cell.get_parameters(expand=False)}


def ported_network(folder, name):
    module = importlib.import_module(f"{name}.model")
    top = getattr(module, type(getattr(torch_port_models, CASES[name][0])()).__name__)
    network = top()
    ms.load_param_into_net(network, ms.load_checkpoint(str(folder / name / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    return network


def a_batch(name, seed=123):
    _, shape, vocab = CASES[name]
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (3, *shape)) if vocab else rng.normal(0, 1, (3, *shape)).astype(np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_a_ported_model_computes_what_pytorch_computes_with_the_same_parameter_names(name, on_path, capsys):
    assert port(name, on_path) == 0
    assert "agree:" in capsys.readouterr().out
    model = getattr(torch_port_models, CASES[name][0])()
    network = ported_network(on_path, name)
    assert {p.name for p in network.get_parameters()} - dropout_counters(network) == expected_names(model)

    batch = a_batch(name)  # not port's batch: another seed, another batch size, normal rather than uniform
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    actual = network(ms.Tensor(batch)).asnumpy()
    assert actual.shape == expected.shape
    assert np.max(np.abs(actual - expected)) <= 1e-4 * np.max(np.abs(expected))


@pytest.mark.slow
def test_resnet50_ports_agrees_and_trains(on_path, graph_mode, capsys):
    """As ResNet-18 (the fast tests), with bottleneck blocks: 32x32 images, batches of 4."""
    CASES["torch_resnet50"] = ("resnet50", (3, 32, 32), None)
    try:
        assert port("torch_resnet50", on_path) == 0
        assert "agree: 183 layers paired" in capsys.readouterr().out
        model, network = torch_port_models.resnet50(), ported_network(on_path, "torch_resnet50")
        assert {p.name for p in network.get_parameters()} == expected_names(model)
        shutil.rmtree(on_path / "torch_resnet50")
        trains_from_its_converted_weights("torch_resnet50", on_path)
    finally:
        del CASES["torch_resnet50"]


def test_batch_norm_momentum_is_pytorch_s_in_training_mode(on_path):
    """MindSpore's momentum is 1 - PyTorch's: one training-mode forward moves the statistics alike."""
    assert port("digits_net", on_path) == 0
    model = torch_port_models.DigitsNet().train()  # stem_norm has momentum 0.2, the block's norm the default 0.1
    network = ported_network(on_path, "digits_net")
    network.set_train(True)
    batch = a_batch("digits_net")
    with torch.no_grad():
        model(torch.from_numpy(batch))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network(ms.Tensor(batch))
    values = {p.name: p.asnumpy() for p in network.get_parameters()}
    for torch_name, name in [("stem_norm.running_mean", "stem_norm.moving_mean"),
                             ("stem_norm.running_var", "stem_norm.moving_variance"),
                             ("block.1.running_mean", "block.1.moving_mean")]:
        np.testing.assert_allclose(values[name], model.state_dict()[torch_name].numpy(), rtol=1e-4, atol=1e-6)


def trains_from_its_converted_weights(name, folder):
    """Port `name`, train it in the app a few steps from the converted weights; every trainable parameter moves."""
    assert port(name, folder) == 0
    _, shape, vocab = CASES[name]
    data = folder / name / "conf" / "data" / "random.yaml"
    data.parent.mkdir()
    data.write_text(f"_target_: tests.common.port_data.RandomSamples\nshape: {list(shape)}\nnum_classes: 4\n"
                    f"vocab: {vocab or 'null'}\n")
    weights = folder / name / "weights.ckpt"
    result = train(compose_config([f"hydra.searchpath=[file://{folder / name / 'conf'}]", f"model={name}",
                                   f"model.pretrained={weights}", "data=random", "logger.progress=off",
                                   f"run_dir={folder / 'run'}", "trainer.save_checkpoints=false", "optimizer=momentum",
                                   "optimizer.lr=0.01"]))
    assert np.isfinite(result.metrics["train_loss"])  # (random weights: eval mode may overflow a deep net)
    before = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(weights)).items()}
    after = {p.name: p.asnumpy() for p in result.network.get_parameters() if p.requires_grad}
    moved = [name for name, value in after.items() if not np.array_equal(value, before[name])]
    assert len(moved) == len(after)  # trained from the converted weights: every one moved by the updates


@pytest.mark.parametrize("name", ["digits_net", "sequence", "transformer", "torch_resnet18"])
def test_a_ported_model_trains_in_the_app_from_its_converted_weights(name, on_path, graph_mode):
    trains_from_its_converted_weights(name, on_path)


class Unported(torch.nn.Module):
    """Two unsupported layers (one in two places), an unsupported option, a function and a method."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.PReLU()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.PReLU())
        self.norm = torch.nn.BatchNorm1d(4, momentum=None)
        self.fine = torch.nn.Linear(4, 2)

    def forward(self, x):
        x = torch.flip(self.inner(self.first(x)), [1])
        return self.fine(self.norm(x)).cumprod(1)


def test_anything_unsupported_is_listed_with_where_it_is_used_and_nothing_is_written(on_path, capsys):
    sys.modules["tests.bridge.test_port"].Unported = Unported
    code = main(["tests.bridge.test_port:Unported", "--out", str(on_path / "ported"), "--input-shape", "4"])
    captured = capsys.readouterr()
    assert code == 2 and not (on_path / "ported").exists()
    lines = captured.out.splitlines()
    assert "unsupported: torch.nn.PReLU: used at first, inner.1" in lines
    assert any(line.startswith("unsupported: torch.nn.BatchNorm1d with momentum=None") and line.endswith("at norm")
               for line in lines)
    assert "unsupported: torch.flip: used at Unported.forward" in lines
    assert "unsupported: Tensor.cumprod: used at Unported.forward" in lines
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("trainkit: error: tests.bridge.test_port:Unported cannot be "
                                                     "ported: 4 unsupported")


@pytest.mark.parametrize("folder, reason", [
    ("os", "which is a module of Python's standard library: python -m os would run that one"),
    ("numpy", "which is an installed module ("),
    ("π_net", "which is not an ASCII Python identifier"),
    ("my-net", "which is not an ASCII Python identifier"),
])
def test_an_out_folder_whose_name_an_importable_module_has_or_hydra_cannot_lex_is_refused(folder, reason, on_path,
                                                                                          capsys):
    """Mutation caught: the old `isidentifier()` check alone wrote a package named os (and π_net)."""
    code = main([f"{MODELS}:DigitsNet", "--out", str(on_path / folder), "--input-shape", "1,8,8"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (on_path / folder).exists()
    assert len(error) == 1 and f"the folder becomes the Python package {folder!r}, {reason}" in error[0]


def test_an_input_shape_the_model_does_not_take_stops_before_anything_is_written(on_path, capsys):
    code = main([f"{MODELS}:DigitsNet", "--out", str(on_path / "ported"), "--input-shape", "3,8,8"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (on_path / "ported").exists()
    assert len(error) == 1 and "does not run on a batch of shape 2x3x8x8" in error[0]


@pytest.mark.parametrize("source, target, shown", [
    ("raise RuntimeError('operator torchvision::nms does not exist')\n", "broken_import:Net",
     "importing broken_import failed: RuntimeError: operator torchvision::nms does not exist; torchvision's C++"),
    ("def Net(**kwargs):\n    raise RuntimeError('Unknown model (resnet9000)')\n", "broken_import:Net",
     "Net() failed: RuntimeError: Unknown model (resnet9000)"),
])
def test_a_model_module_that_fails_on_import_or_a_factory_that_refuses_is_one_line(source, target, shown, on_path,
                                                                                  capsys):
    """A model module whose own import fails (torchvision built for another torch: timm then fails on
    ``torchvision::nms``) or a factory that raises its own error (timm's unknown model name) is one line, exit 2,
    nothing written. Mutation caught: only ImportError / TypeError caught (the RuntimeError was a traceback)."""
    (on_path / "broken_import.py").write_text(source)
    sys.modules.pop("broken_import", None)
    code = main([target, "--out", str(on_path / "ported"), "--input-shape", "8"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (on_path / "ported").exists()
    assert len(error) == 1 and shown in error[0], error
