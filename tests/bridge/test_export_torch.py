"""python -m trainkit.export --to torch: a network's weights back under PyTorch's names, bitwise, loadable strictly
into the PyTorch model; a trained model exported back computes in PyTorch what it computes in trainkit."""
import json

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.bridge.test_convert import user_project, write_mapping  # noqa: E402
from tests.bridge.test_port import port  # noqa: E402
from tests.common import torch_models, torch_port_models  # noqa: E402
from trainkit.app import train  # noqa: E402
from trainkit.app.config import compose_config  # noqa: E402
from trainkit.bridge.compare import main as compare  # noqa: E402
from trainkit.bridge.convert import main as convert  # noqa: E402
from trainkit.export import main as export  # noqa: E402


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_pytorch_to_trainkit_to_pytorch_is_bitwise(suffix, on_path, capsys):
    assert port("torch_resnet18", on_path) == 0  # its weights converted to torch_resnet18/weights.ckpt
    original = torch_port_models.resnet18().state_dict()
    output = on_path / f"back{suffix}"
    assert export([str(on_path / "torch_resnet18" / "weights.ckpt"), str(output), "--to", "torch"]) == 0
    assert f"wrote {output}: 102 tensors" in capsys.readouterr().out
    if suffix == ".pth":
        back = torch.load(str(output), weights_only=True)
        assert type(back) is dict and all(type(value) is torch.Tensor for value in back.values())
    else:
        from safetensors.torch import load_file
        back = load_file(str(output))
    assert set(back) == set(original)
    for name, value in original.items():
        if name.endswith("num_batches_tracked"):  # MindSpore keeps no count: written as 0
            assert back[name].dtype == torch.int64 and back[name].shape == () and back[name].item() == 0
        else:
            assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    torch_port_models.resnet18().load_state_dict(back, strict=True)


def test_the_mapping_file_is_applied_in_reverse(tmp_path, capsys):
    state = torch_models.UserMLP(seed=5).state_dict()
    torch.save(state, tmp_path / "user.pth")
    mapping = write_mapping(tmp_path)
    assert convert([str(tmp_path / "user.pth"), str(tmp_path / "user.ckpt"), *user_project(tmp_path),
                    "--mapping", str(mapping)]) == 0
    assert export([str(tmp_path / "user.ckpt"), str(tmp_path / "back.pth"), "--mapping", str(mapping)]) == 0
    back = torch.load(str(tmp_path / "back.pth"), weights_only=True)
    assert set(back) == set(state)  # encoder.*, classifier.*: not body.0.*, body.2.*
    assert all(torch.equal(back[name], state[name]) for name in state)


def test_a_mapping_that_cannot_be_reversed_and_an_existing_output_stop_with_one_line(tmp_path, capsys):
    (tmp_path / "model.ckpt").write_bytes(b"")
    ms.save_checkpoint([{"name": "body.0.weight", "data": ms.Tensor(np.ones((2, 2), np.float32))}],
                       str(tmp_path / "model.ckpt"))
    (tmp_path / "regex.yaml").write_text("- {pattern: '^enc(oder)?\\.', replace: 'body.0.'}\n")
    assert export([str(tmp_path / "model.ckpt"), str(tmp_path / "out.pth"), "--mapping",
                   str(tmp_path / "regex.yaml")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "cannot be applied in reverse" in error[0] and not (tmp_path / "out.pth").exists()
    (tmp_path / "out.safetensors").write_text("mine")
    assert export([str(tmp_path / "model.ckpt"), str(tmp_path / "out.safetensors")]) == 2
    assert "already exists" in capsys.readouterr().err and (tmp_path / "out.safetensors").read_text() == "mine"


@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_force_onto_a_folder_or_under_a_file_is_one_line_and_touches_nothing(where, tmp_path, capsys):
    """Mutation caught: without the folder / parent-file check in refuse_existing, --force reached the write and
    ended in IsADirectoryError / NotADirectoryError tracebacks."""
    ms.save_checkpoint([{"name": "body.0.weight", "data": ms.Tensor(np.ones((2, 2), np.float32))}],
                       str(tmp_path / "model.ckpt"))
    if where == "folder":
        output = tmp_path / "d.pth"
        (output / "inside").mkdir(parents=True)
        expected = f"{output} is a folder: nothing was written"
    else:
        (tmp_path / "plain").write_text("mine")
        output = tmp_path / "plain" / "sub" / "out.pth"
        expected = f"{output} cannot be written: {tmp_path / 'plain'} is a file, not a folder"
    before = sorted((str(p), p.is_dir()) for p in tmp_path.rglob("*"))
    assert export([str(tmp_path / "model.ckpt"), str(output), "--to", "torch", "--force"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"trainkit: error: {expected}" + error[0][len(f"trainkit: error: {expected}"):]]
    assert sorted((str(p), p.is_dir()) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "plain").read_text() == "mine" if where != "folder" else (output / "inside").is_dir()


def test_a_trained_model_exported_back_agrees_with_trainkit_in_compare(on_path, graph_mode, capsys):
    assert port("digits_net", on_path) == 0
    conf = on_path / "digits_net" / "conf"
    (conf / "data").mkdir()
    (conf / "data" / "random.yaml").write_text("_target_: tests.common.port_data.RandomSamples\nshape: [1, 8, 8]\n"
                                               "num_classes: 10\n")
    overrides = [f"hydra.searchpath=[file://{conf}]", "model=digits_net", "data=random"]
    train(compose_config([*overrides, f"model.pretrained={on_path / 'digits_net' / 'weights.ckpt'}",
                                   "logger.progress=off", f"run_dir={on_path / 'run'}", "optimizer.lr=0.05"]))
    trained = on_path / "run" / "checkpoints" / "best.ckpt"
    assert export([str(trained), str(on_path / "trained.pth")]) == 0
    back = torch.load(str(on_path / "trained.pth"), weights_only=True)
    model = torch_port_models.DigitsNet()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    model.load_state_dict(back, strict=True)
    assert not torch.equal(model.state_dict()["stem.weight"], before["stem.weight"])  # the trained weights
    capsys.readouterr()
    code = compare([str(trained), *overrides, "--torch-model", "tests.common.torch_port_models:DigitsNet",
                    "--torch-weights", str(on_path / "trained.pth"), "--input-shape", "1,8,8",
                    "--json", str(on_path / "verdict.json")])
    assert code == 0 and "agree:" in capsys.readouterr().out
    verdict = json.loads((on_path / "verdict.json").read_text())
    assert verdict["first_divergence"] is None and verdict["paired_layers"] >= 15
