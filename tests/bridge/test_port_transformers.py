"""python -m trainkit.port on transformers as people write them (class tokens and position embeddings as
nn.Parameter, torch.arange, expand, masks from token ids, scaled_dot_product_attention, chunk/split, einsum) and on
torchvision's and timm's: each ported with its own random weights computes what PyTorch computes in eval mode, on a
batch port never saw."""
import importlib
import inspect
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.bridge.test_port import dropout_counters, expected_names  # noqa: E402
from tests.common import torch_transformer_models  # noqa: E402
from tests.common.port_data import train_ported  # noqa: E402
from tests.common.torch_port_models import randomised  # noqa: E402
from trainkit.bridge.compare import main as compare  # noqa: E402
from trainkit.bridge.port import main  # noqa: E402
from trainkit.models.dropout import streams_from_zero  # noqa: E402
from trainkit.new import main as new  # noqa: E402

MODELS = "tests.common.torch_transformer_models"
ROOT = Path(__file__).resolve().parents[2]
# name: (factory, one sample's shape, token vocabulary or None)
CASES = {
    "vit": ("ViT", (3, 16, 16), None),
    "bert": ("BertEncoder", (12,), 50),
    "timm_vit": ("timm_vit", (3, 32, 32), None),
    "torchvision_vit": ("torchvision_vit", (3, 32, 32), None),
}


def port(name, folder, *extra):
    factory, shape, vocab = CASES[name]
    argv = [f"{MODELS}:{factory}", "--out", str(folder / name), "--input-shape", ",".join(map(str, shape)), *extra]
    return main(argv + (["--input-ints", str(vocab)] if vocab else []))


def a_batch(name, seed=123):
    """Another batch than port's: another seed and size, normal rather than uniform; ids with padding at the end."""
    _, shape, vocab = CASES[name]
    rng = np.random.default_rng(seed)
    if not vocab:
        return rng.normal(0, 1, (3, *shape)).astype(np.float32)
    ids = rng.integers(1, vocab, (3, *shape))
    ids[0, 7:] = 0  # padding the mask must hide
    ids[1, 4:] = 0
    return ids


def ported_network(folder, name, model):
    module = importlib.import_module(f"{name}.model")
    network = getattr(module, type(model).__name__)()
    ms.load_param_into_net(network, ms.load_checkpoint(str(folder / name / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    return network


@pytest.mark.parametrize("name", list(CASES))
def test_a_ported_transformer_computes_what_pytorch_computes(name, on_path, capsys):
    """Mutations caught: the boolean mask ignored in the scaled_dot_product_attention helper (bert); einsum's matmul
    operands swapped (vit); Tensor.expand written as ops.tile (vit, timm_vit, torchvision_vit)."""
    assert port(name, on_path) == 0, capsys.readouterr().out
    assert "agree:" in capsys.readouterr().out
    model = getattr(torch_transformer_models, CASES[name][0])()
    network = ported_network(on_path, name, model)
    assert {p.name for p in network.get_parameters()} - dropout_counters(network) == expected_names(model)

    batch = a_batch(name)
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    actual = network(ms.Tensor(batch)).asnumpy()
    assert actual.shape == expected.shape
    assert np.max(np.abs(actual - expected)) <= 1e-4 * np.max(np.abs(expected))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def parameters(network):
    return {p.name: p.asnumpy().copy() for p in network.get_parameters()}


@pytest.mark.slow
def test_a_ported_transformer_with_dropout_resumes_bitwise_and_repeats_with_its_seed(on_path, graph_mode):
    """PyTorch's TransformerEncoder (dropout 0.1 in attention, feed-forward and residuals), ported, trained in the
    app 2 epochs of 2 steps: a second run with the seed ends bitwise equal, and so does a run resumed from the
    checkpoint at epoch 2 step 1, without the "resume is not exact" warning. Mutation caught: the encoder layer
    helper's and its attention's dropouts written as MindSpore's nn.Dropout."""
    folder = on_path / "transformer"
    assert main(["tests.common.torch_port_models:TransformerClassifier", "--out", str(folder), "--input-shape", "10",
                 "--input-ints", "50"]) == 0
    data = folder / "conf" / "data" / "random.yaml"
    data.parent.mkdir()
    data.write_text("_target_: tests.common.port_data.RandomSamples\nshape: [10]\nnum_classes: 4\nvocab: 50\n"
                    "samples: 16\n")

    def run(name, *extra):
        return train_ported(folder, "transformer", on_path / name, *extra)

    first = parameters(run("a").wrapper)
    again = parameters(run("b").wrapper)
    handler = Lines()
    logging.getLogger("trainkit").addHandler(handler)
    try:
        resumed = parameters(run("c", f"trainer.resume={on_path / 'a' / 'checkpoints' / 'trainkit-2_1.ckpt'}").wrapper)
    finally:
        logging.getLogger("trainkit").removeHandler(handler)
    for other in (again, resumed):
        assert sorted(other) == sorted(first)
        differing = [name for name in first if not np.array_equal(other[name], first[name])]
        assert not differing, differing[:5]
    assert not [line for line in handler.lines if "not exact" in line]
    counters = [name for name in first if name.endswith(".calls")]
    assert len(counters) == 8 and all(first[name] > 0 for name in counters)  # 2 layers x 4 dropouts, all drawn


def test_functional_dropout_becomes_a_layer_whose_stream_a_checkpoint_holds(on_path, capsys):
    """F.dropout(x, p, training=self.training) is written as a trainkit Dropout layer of the class (its call counter
    a Parameter, so a checkpoint holds the stream), not ops.dropout: in training mode it zeroes about p of the
    values and scales the rest by 1 / (1 - p) (NumPy, here), and a network built again with the seed and its counter
    set to 1 draws the mask the first network drew at its second call (a resume). Mutation caught: the functional
    layer left out (ops.dropout written: no counter, the resumed mask differs)."""
    assert main([f"{MODELS}:FunctionalDropoutHead", "--out", str(on_path / "fdrop"), "--input-shape", "8"]) == 0
    assert "eval mode's path only" not in capsys.readouterr().out  # training=self.training is no branch
    source = (on_path / "fdrop" / "model.py").read_text()
    assert "ops.dropout" not in source and "self.dropout = Dropout(" in source
    module = importlib.import_module("fdrop.model")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    values = np.random.default_rng(0).uniform(1, 2, (2, 4000)).astype(np.float32)

    def network():  # as the app builds a model: the seed set, the random layers' streams numbered from 0
        ms.set_seed(7)
        with streams_from_zero():
            built = module.FunctionalDropoutHead()
        built.set_train(True)
        return built

    first = network()
    counters = [p.name for p in first.get_parameters() if p.name.endswith(".calls")]
    assert counters == ["dropout.calls"]
    masks = [first.dropout(ms.Tensor(values)).asnumpy() for _ in range(2)]
    for out in masks:
        dropped = out == 0
        assert 0.2 < dropped.mean() < 0.3  # p = 0.25 of 8000 draws
        np.testing.assert_allclose(out[~dropped], values[~dropped] / 0.75, rtol=1e-6)
    assert not np.array_equal(masks[0] == 0, masks[1] == 0)
    resumed = network()
    resumed.dropout.calls.set_data(ms.Tensor(1, ms.int32))
    np.testing.assert_array_equal(resumed.dropout(ms.Tensor(values)).asnumpy(), masks[1])


def test_a_forward_that_branches_on_training_mode_is_said_to_be_ported_in_eval_mode_only(on_path, capsys):
    """An auxiliary head computed under ``if self.training:`` is not in the trace (eval mode): port says so in one
    line and in the generated file, rather than leaving it out silently. Mutation caught: the check answering no."""
    assert main([f"{MODELS}:AuxiliaryHead", "--out", str(on_path / "aux"), "--input-shape", "8"]) == 0
    out = capsys.readouterr().out
    assert "eval mode's path only: the forward of AuxiliaryHead branches on self.training" in out
    assert "forward branches on self.training" in (on_path / "aux" / "model.py").read_text()


def test_a_buffer_read_in_forward_stays_the_module_s_buffer(on_path, capsys):
    """An index buffer read with a method in forward (``self.index.view(-1)``, MaxViT's relative position index) is
    written as the module's buffer, not as a tensor constant fx folded (``self._tensor_constant0``, which the ported
    Cell does not have); Tensor.sum over an axis agrees (port compares with PyTorch). Mutation caught: fx's default,
    buffers not proxied (the port failed on the batch)."""
    assert main([f"{MODELS}:IndexedBias", "--out", str(on_path / "indexed"), "--input-shape", "6"]) == 0, \
        capsys.readouterr().out
    source = (on_path / "indexed" / "model.py").read_text()
    assert "_tensor_constant" not in source and "self.index" in source


def test_compare_takes_token_ids_random_or_from_an_int_npy(on_path, capsys):
    """The ported encoder against PyTorch's through python -m trainkit.compare: random ids (--input-ints) and an
    int64 .npy batch with padding both agree, and the .npy's ids reach both sides as integers. Mutations caught:
    the .npy cast to float32 as before (MindSpore's Gather kernel refuses float ids), --input-ints ignored (a
    float batch)."""
    assert port("bert", on_path) == 0
    model = torch_transformer_models.BertEncoder()
    torch.save(model.state_dict(), on_path / "bert.pth")
    ids = a_batch("bert")
    np.save(on_path / "ids.npy", ids)
    capsys.readouterr()
    common = [str(on_path / "bert" / "weights.ckpt"), f"hydra.searchpath=[file://{on_path / 'bert' / 'conf'}]",
              "model=bert", "data=wine",  # wine: BertEncoder's 3 classes
              "--torch-model", f"{MODELS}:BertEncoder", "--torch-weights", str(on_path / "bert.pth"),
              "--json", str(on_path / "verdict.json")]
    assert compare([*common, "--input-ints", "50", "--input-shape", "12"]) == 0, capsys.readouterr()
    assert json.loads((on_path / "verdict.json").read_text())["batch_shape"] == [2, 12]
    assert compare([*common, "--input", str(on_path / "ids.npy")]) == 0, capsys.readouterr()
    verdict = json.loads((on_path / "verdict.json").read_text())
    assert verdict["batch_shape"] == list(ids.shape) and verdict["first_divergence"] is None
    assert "agree:" in capsys.readouterr().out

    assert compare([*common, "--input-ints", "50"]) == 2
    assert capsys.readouterr().err.strip() == ("trainkit: error: --input-ints needs --input-shape, one sample's "
                                               "shape: e.g. --input-shape 12 for 12 tokens")


class BlobClassifier(torch.nn.Module):
    """8 features -> 3 classes, the shapes of a trainkit.new project's data."""

    def __init__(self, num_features: int = 8, num_classes: int = 3, hidden: int = 16):
        super().__init__()
        self.hidden = torch.nn.Linear(num_features, hidden)
        self.drop = torch.nn.Dropout(0.1)
        self.out = torch.nn.Linear(hidden, num_classes)

    def forward(self, features):
        return self.out(self.drop(torch.relu(self.hidden(features))))


def test_port_into_a_project_made_by_new_trains_with_the_project_s_command(on_path, capsys):
    """python -m trainkit.new, then port --into it: python -m PROJECT model=NAME trains the ported model from the
    converted weights (the run's log names the ported class and the weights loaded). Mutation caught: the model
    config written beside the package rather than into the project's conf/ (Hydra: model=blobnet not found)."""
    assert new(["shop", str(on_path / "shop")]) == 0
    sys.modules[__name__].BlobClassifier = BlobClassifier
    assert main([f"{__name__}:BlobClassifier", "--into", str(on_path / "shop"), "--out", "blobnet",
                 "--input-shape", "8"]) == 0
    out = capsys.readouterr().out
    assert "train it in the project: cd " in out
    assert (on_path / "shop" / "shop" / "blobnet" / "model.py").is_file()
    run_dir = on_path / "run"
    done = subprocess.run([sys.executable, "-m", "shop", "model=blobnet", "model.pretrained=shop/blobnet/weights.ckpt",
                           "trainer.epochs=1", "logger.progress=off", f"hydra.run.dir={run_dir}"],
                          cwd=on_path / "shop", capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(on_path / "shop")])})
    assert done.returncode == 0, done.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "_target_: shop.blobnet.model.BlobClassifier" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert "BlobClassifier: 195 trainable parameters" in log  # 8 x 16 + 16 + 16 x 3 + 3
    assert "model.pretrained: 5 parameters loaded" in log  # 4 of PyTorch's and the dropout's counter
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("test/accuracy" in record for record in records)


class SiluEncoder(torch.nn.Module):
    """A Transformer encoder layer with a layer as its activation (neither "relu" nor "gelu")."""

    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.embed = torch.nn.Embedding(30, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=torch.nn.SiLU(),
                                                      batch_first=True)
        self.head = torch.nn.Linear(16, num_classes)
        randomised(self, 0)

    def forward(self, ids):
        return self.head(self.layer(self.embed(ids))[:, 0])


def test_generated_source_takes_pytorch_s_arguments_and_names_its_variables(on_path, capsys):
    """The top class takes num_classes (and what else only its own layers use) with PyTorch's defaults; construct's
    variables are the source's names (q, k, v, attn), never fx's (getitem_3, add_1); the encoder layer's activation
    is PyTorch's layer (SiLU agrees) and an unknown name is refused, not turned into ReLU. Mutations caught: the
    Namer's source-line names off (fx names come back), the helper's old switch (anything but gelu -> ReLU)."""
    assert port("vit", on_path) == 0
    source = (on_path / "vit" / "model.py").read_text()
    compile(source, "model.py", "exec")
    assert not re.findall(r"^\s*(?:getitem|getattr|add|mul|chunk|einsum|floordiv|transpose)(?:_\d+)?\s*=", source,
                          re.MULTILINE)
    assert "q = q_k_v[0]" in source and "attn = ops.softmax(attn, axis=-1)" in source
    module = importlib.import_module("vit.model")
    signature = inspect.signature(module.ViT)
    assert signature.parameters["num_classes"].default == 10 and signature.parameters["in_channels"].default == 3
    ms.set_context(mode=ms.PYNATIVE_MODE)
    five = module.ViT(num_classes=5, in_channels=1)
    five.set_train(False)
    assert five(ms.Tensor(np.zeros((2, 1, 16, 16), np.float32))).shape == (2, 5)
    assert "num_classes: 10" in (on_path / "vit" / "conf" / "model" / "vit.yaml").read_text()

    sys.modules[__name__].SiluEncoder = SiluEncoder
    assert main([f"{__name__}:SiluEncoder", "--out", str(on_path / "silu"), "--input-shape", "6",
                 "--input-ints", "30"]) == 0, capsys.readouterr().out
    silu = importlib.import_module("silu.model")
    assert "activation=nn.SiLU()" in (on_path / "silu" / "model.py").read_text()
    with pytest.raises(ValueError, match="activation='tanh' is not valid"):
        silu.TransformerEncoderLayer(16, 2, 32, 0.0, "tanh", 1e-5, True, False)


@pytest.mark.parametrize("name", ["regnet_y_400mf", pytest.param("densenet121", marks=pytest.mark.slow)])
def test_torchvision_models_of_named_sequentials_port_to_valid_python_and_agree(name, on_path, capsys):
    """RegNet's stages (nn.Sequential subclasses, children named block1-0) were written as `self.block1-0 = ...`, a
    SyntaxError; DenseNet's port did not take its own weights. Mutation caught: Sequential subclasses traced as
    classes of their own again (RegNet: SyntaxError)."""
    out = on_path / name
    assert main([f"{MODELS}:torchvision_cnn", "--arg", f"name={name}", "--out", str(out),
                 "--input-shape", "3,32,32"]) == 0, capsys.readouterr().out
    compile((out / "model.py").read_text(), "model.py", "exec")
    assert "agree:" in capsys.readouterr().out
