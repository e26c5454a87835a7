"""Hugging Face ``transformers`` models port: BERT, DistilBERT, GPT-2, ViT, RoBERTa and ALBERT, each built from a
tiny config with random weights, port with trainkit.port's Python API and compute in eval mode what PyTorch
computes (checked here against the PyTorch model itself, on a batch port never saw: another batch size, pad ids).
A text model is called with the attention mask of its pad ids, which the ported one computes from its ids."""
import importlib

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.common import torch_hf_models  # noqa: E402  (torchvision's schemas, then transformers)
from trainkit.bridge.compare import DEFAULT_TOLERANCE  # noqa: E402
from trainkit.bridge.port import port  # noqa: E402

MODELS = "tests.common.torch_hf_models"
# name: its input, one sample's shape, --input-ints
TEXT, IMAGE = ([16], 100), ([3, 16, 16], None)
CASES = {"bert": TEXT, "distilbert": TEXT, "gpt2": TEXT, "vit": IMAGE, "roberta": TEXT, "albert": TEXT}


def _batch(name, shape, ints):
    generator = np.random.default_rng(123)
    if ints is None:
        return generator.normal(0, 1, (3, *shape)).astype(np.float32)
    ids = generator.integers(2, ints, (3, *shape))
    ids[1, shape[0] // 2:] = PAD[name]  # a padded sentence
    ids[2, shape[0] - 3:] = PAD[name]
    return ids


PAD = {"bert": 0, "distilbert": 0, "gpt2": 0, "roberta": 1, "albert": 0}  # their configs' pad_token_id


@pytest.mark.parametrize("name", list(CASES))
def test_a_transformers_model_ports_and_computes_what_pytorch_computes(name, on_path, capsys):
    """Mutations caught: len() on a proxy left to fx (every model refused), a ModelOutput's field read by name
    (`outputs.last_hidden_state` written as an attribute of a tuple), **kwargs left a placeholder, the cumsum of
    GPT-2's bool mask not cast (MindSpore refuses it), gather/addmm/pow unmapped, the mask from pad ids left out
    (the padded sentences' logits differ), the trace on ids without padding (transformers skips a mask of ones:
    the ported layers got no mask, trainkit.bridge.port.trace.with_padding)."""
    shape, ints = CASES[name]
    # seed 1: port's random ids hold no pad id (0 or 1), as with a real vocabulary's; port pads a sample itself
    assert not np.isin(np.random.default_rng(1).integers(0, 100, (2, 16)), [0, 1]).any()
    assert port(f"{MODELS}:{name}", {}, on_path / name, shape, input_ints=ints, seed=1) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "agree:" in out
    if ints:
        assert f"computes its attention_mask from the ids: attention_mask=(input_ids != {PAD[name]})" in out
    if name != "gpt2":  # (GPT-2 hands its position ids, a tensor, down through **kwargs: read from it)
        # transformers' **kwargs of flags and Nones, handed from layer to layer, are written as passed
        assert "kwargs[" not in (on_path / name / "model.py").read_text()

    config = (on_path / name / "conf" / "model" / f"{name}.yaml").read_text()
    top = next(line for line in config.splitlines() if line.startswith("_target_:")).rsplit(".", 1)[1]
    network = getattr(importlib.import_module(f"{name}.model"), top)()
    ms.load_param_into_net(network, ms.load_checkpoint(str(on_path / name / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    batch = _batch(name, shape, ints)
    inputs = {"attention_mask": torch.from_numpy(batch != PAD[name]).long()} if ints else {}
    with torch.no_grad():
        expected = getattr(torch_hf_models, name)()(torch.from_numpy(batch), **inputs).logits.numpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    actual = network(ms.Tensor(batch)).asnumpy()
    assert actual.shape == expected.shape == (3, 3)
    assert np.max(np.abs(actual - expected)) <= DEFAULT_TOLERANCE * np.max(np.abs(expected))


def test_tied_weights_stay_one_parameter_held_once(on_path, capsys):
    """GPT-2's lm_head.weight is its token embedding's table: the ported model shares one Parameter (a change to
    one is the other's), the checkpoint holds it once, and the logits are PyTorch's. Without a pad id (GPT-2's
    default) there is no mask: transformers checks for packed sequences with a cumsum of a bool tensor, which
    MindSpore refuses unless it is cast as PyTorch's result is (int64). Mutations caught: the tie line left out
    (two Parameters; the head's a copy), the alias kept in the state dict (the conversion refuses a name the
    network lacks), the cumsum's dtype not said."""
    assert port(f"{MODELS}:gpt2_lm", {}, on_path / "lm", [16], input_ints=100) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "tied weights, one Parameter each as in PyTorch: lm_head.weight is transformer.wte.weight" in out
    assert "attention_mask" not in out
    assert "lm_head.weight" not in ms.load_checkpoint(str(on_path / "lm" / "weights.ckpt"))

    network = importlib.import_module("lm.model").GPT2LMHeadModel()
    ms.load_param_into_net(network, ms.load_checkpoint(str(on_path / "lm" / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    assert network.lm_head.weight is network.transformer.wte.weight
    assert [name for name, _ in network.parameters_and_names()].count("transformer.wte.weight") == 1
    batch = np.random.default_rng(7).integers(0, 100, (3, 16))
    with torch.no_grad():
        expected = torch_hf_models.gpt2_lm()(torch.from_numpy(batch)).logits.numpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    actual = network(ms.Tensor(batch)).asnumpy()
    assert actual.shape == expected.shape == (3, 16, 100)
    assert np.max(np.abs(actual - expected)) <= DEFAULT_TOLERANCE * np.max(np.abs(expected))


def test_finfo_of_a_traced_dtype_is_its_number(on_path, capsys):
    """transformers' eager masks (MPNet, Bloom) fill with torch.finfo(embeds.dtype).min, a dtype fx traces: the
    trace answers it from the value computed and says so. Mutation caught: finfo left to fx (`torch.finfo()
    requires a floating point input type`, nothing written)."""
    assert port(f"{MODELS}:SmallestFilled", {}, on_path / "filled", [4]) == 0, capsys.readouterr().out
    assert "holds for inputs of shape 4 only" in capsys.readouterr().out
    network = importlib.import_module("filled.model").SmallestFilled()
    batch = np.random.default_rng(3).random((3, 4)).astype(np.float32)
    expected = np.where(batch > 0.5, 0.0, np.finfo(np.float32).min) + batch  # NumPy's float32 minimum
    ms.set_context(mode=ms.PYNATIVE_MODE)
    assert np.array_equal(network(ms.Tensor(batch)).asnumpy(), expected.astype(np.float32))
