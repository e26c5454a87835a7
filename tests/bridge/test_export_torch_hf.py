"""export --to torch of ported transformers models: a Parameter two modules share (a language model's head and its
token embedding), which a MindSpore checkpoint keeps once, comes back under every name PyTorch's state_dict lists,
so the file loads with load_state_dict(strict=True) into the transformers class, and that model predicts what the
ported one predicts. The second names are port's record in the model config (model.tied_weights), read from the
config a run's checkpoint stores or from the ported package's own model config."""
import importlib

import mindspore as ms
import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from tests.common import torch_hf_models  # noqa: E402  (torchvision's schemas, then transformers)
from trainkit.app.finetune import model_arguments  # noqa: E402
from trainkit.app.targets import check_node  # noqa: E402
from trainkit.bridge.compare import DEFAULT_TOLERANCE  # noqa: E402
from trainkit.bridge.export_torch import ported_config  # noqa: E402
from trainkit.bridge.port import port  # noqa: E402
from trainkit.export import main as export  # noqa: E402
from trainkit.rundir.checkpoint_file import CONFIG_ENTRY, save_checksummed  # noqa: E402

MODELS = "tests.common.torch_hf_models"
# the names PyTorch's state_dict lists twice (alias: the first name), as transformers' classes tie them
TIES = {"bert_mlm": {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                     "cls.predictions.decoder.bias": "cls.predictions.bias"},
        "gpt2_lm": {"lm_head.weight": "transformer.wte.weight"}}
PAD = {"bert_mlm": 0, "gpt2_lm": None}  # GPT-2 names no pad id: called with its ids alone


# about 8 s each: a port of a two-layer model (the test of tied weights needs a ported network to export)
@pytest.mark.parametrize("name", list(TIES))
def test_a_ported_language_model_exports_every_tied_name_and_loads_strictly_into_its_class(name, on_path, capsys):
    """Mutations caught: the ties left out of the export (strict load: missing cls.predictions.decoder.weight,
    lm_head.weight), port's model config without its record (the same), the alias written as the first name's
    neighbour in the state dict but from another array (the values differ)."""
    original = getattr(torch_hf_models, name)()
    for alias, first in TIES[name].items():  # the model ties them: one Parameter, two names in its state_dict
        assert original.get_parameter(alias) is original.get_parameter(first)
    assert port(f"{MODELS}:{name}", {}, on_path / name, [16], input_ints=100) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert export([str(on_path / name / "weights.ckpt"), str(on_path / "back.pt"), "--to", "torch"]) == 0
    printed = capsys.readouterr().out
    assert all(f"{alias} is {first}" in printed for alias, first in TIES[name].items()), printed

    back = torch.load(on_path / "back.pt", weights_only=True)
    assert set(back) == set(original.state_dict())
    for key, value in original.state_dict().items():  # the ported weights are PyTorch's, bitwise
        assert torch.equal(back[key], value), key
    torch.manual_seed(1)  # the class built again with other weights: the file's are the ones it computes with
    fresh = type(original)(original.config).eval()
    fresh.load_state_dict(back, strict=True)

    config = yaml.safe_load((on_path / name / "conf" / "model" / f"{name}.yaml").read_text())
    network = getattr(importlib.import_module(f"{name}.model"), config["_target_"].rsplit(".", 1)[1])()
    ms.load_param_into_net(network, ms.load_checkpoint(str(on_path / name / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    ids = np.random.default_rng(5).integers(2, 100, (3, 16))
    ids[1, 9:] = 0  # a padded sentence (for BERT; GPT-2 has no pad id: token 0 like any other)
    inputs = {} if PAD[name] is None else {"attention_mask": torch.from_numpy(ids != PAD[name]).long()}
    with torch.no_grad():
        expected = fresh(torch.from_numpy(ids), **inputs).logits.numpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    actual = network(ms.Tensor(ids)).asnumpy()
    assert actual.shape == expected.shape == (3, 16, 100)
    assert np.max(np.abs(actual - expected)) <= DEFAULT_TOLERANCE * np.max(np.abs(expected))


class Tied(torch.nn.Module):
    """A token embedding and an output layer holding its table, as a language model ties them."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5)
        self.head.weight = self.embed.weight


def _run_checkpoint(folder, tied, values):
    """A run directory whose best.ckpt holds `values` and the run's config with model.tied_weights = `tied`."""
    config = {"model": {"_target_": "lm.model.Tied", **({"tied_weights": tied} if tied is not None else {})},
              "trainer": {"epochs": 1}}
    (folder / "checkpoints").mkdir(parents=True)
    save_checksummed([{"name": key, "data": ms.Tensor(value)} for key, value in values.items()],
                     folder / "checkpoints" / "best.ckpt", {CONFIG_ENTRY: yaml.safe_dump(config)})


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_run_directory_exports_its_tied_weights_from_the_config_its_checkpoint_stores(suffix, tmp_path, capsys):
    """The run's stored config names the tie; the export writes the table under both names, and PyTorch's module
    takes the file strictly. Mutation caught: the stored config not read (head.weight missing)."""
    generator = np.random.default_rng(0)
    values = {"embed.weight": generator.normal(size=(5, 3)).astype(np.float32),
              "head.bias": generator.normal(size=5).astype(np.float32)}
    _run_checkpoint(tmp_path / "run", [["head.weight", "embed.weight"]], values)
    output = tmp_path / f"back{suffix}"
    assert export([str(tmp_path / "run"), str(output), "--to", "torch"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {output}: 2 tensors" in printed and "head.weight is embed.weight" in printed
    if suffix == ".pt":
        back = torch.load(output, weights_only=True)
    else:
        from safetensors.torch import load_file

        back = load_file(str(output))
    model = Tied()
    model.load_state_dict(back, strict=True)
    assert model.head.weight is model.embed.weight
    assert np.array_equal(model.head.weight.detach().numpy(), values["embed.weight"])
    assert np.array_equal(model.head.bias.detach().numpy(), values["head.bias"])


@pytest.mark.parametrize("tied, said", [
    ([["head.weight"]], "model.tied_weights in the config stored in"),
    ("head.weight=embed.weight", "model.tied_weights in the config stored in"),
    ([["head.weight", "decoder.weight"]], "model.tied_weights ties head.weight to decoder.weight, which the "
                                          "checkpoint does not hold"),
], ids=["not-a-pair", "not-a-list", "a-name-it-lacks"])
def test_a_bad_record_of_ties_stops_with_one_line_naming_it_and_writes_nothing(tied, said, tmp_path, capsys):
    _run_checkpoint(tmp_path / "run", tied, {"embed.weight": np.ones((5, 3), np.float32)})
    assert export([str(tmp_path / "run"), str(tmp_path / "back.pt"), "--to", "torch"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and said in error[0], error
    assert not (tmp_path / "back.pt").exists()


def test_the_ported_package_s_model_config_is_found_in_it_or_in_its_project(tmp_path):
    """port --out DIR writes DIR/conf/model/DIR.yaml; port --into PROJECT writes PROJECT/NAME/DIR and
    PROJECT/NAME/conf/model/DIR.yaml."""
    alone = tmp_path / "lm" / "conf" / "model" / "lm.yaml"
    project = tmp_path / "shop" / "shop" / "conf" / "model" / "lm.yaml"
    for path in (alone, project):
        path.parent.mkdir(parents=True)
        path.write_text("_target_: x.model.Tied\n")
    (tmp_path / "shop" / "shop" / "lm").mkdir()
    assert ported_config(tmp_path / "lm" / "weights.ckpt") == alone
    assert ported_config(tmp_path / "shop" / "shop" / "lm" / "weights.ckpt") == project
    assert ported_config(tmp_path / "elsewhere" / "weights.ckpt") is None


def test_the_record_is_no_constructor_argument_and_no_unknown_key():
    """model.tied_weights is trainkit's key: the model is built without it, and the key check lets it by.
    Mutation caught: it left out of NOT_ARGUMENTS (the constructor gets tied_weights; an unknown key)."""
    node = {"_target_": "trainkit.models.mlp.MLP", "in_features": 4, "out_features": 3,
            "tied_weights": [["head.weight", "embed.weight"]]}
    from omegaconf import OmegaConf

    check_node("model", OmegaConf.create(node))
    assert "tied_weights" not in model_arguments(OmegaConf.create(node))
