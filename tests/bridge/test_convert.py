"""python -m trainkit.convert: PyTorch weights into the network a config builds, outputs equal to PyTorch's."""

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from tests.common import torch_models  # noqa: E402
from trainkit.bridge.convert import main  # noqa: E402
from trainkit.models import resnet18, resnet50  # noqa: E402

ARCHITECTURES = {"resnet18": (torch_models.resnet18, resnet18), "resnet50": (torch_models.resnet50, resnet50)}
IMAGE = 16
CIFAR = ["recipe=resnet50_cifar10", f"data.image_size={IMAGE}"]


def save_both(state_dict, folder, name):
    """The state dict as torch.save writes it and as .safetensors."""
    pth, safetensors = folder / f"{name}.pth", folder / f"{name}.safetensors"
    torch.save(state_dict, pth)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(safetensors))
    return pth, safetensors


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def torch_resnet(request, tmp_path_factory):
    """A random torchvision-layout ResNet (BN statistics too), its files, and its eval output on a fixed batch."""
    model = ARCHITECTURES[request.param][0](num_classes=10, seed=1)
    folder = tmp_path_factory.mktemp(request.param)
    batch = np.random.default_rng(0).uniform(-1, 1, (2, 3, IMAGE, IMAGE)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    return request.param, model, save_both(model.state_dict(), folder, "weights"), batch, expected


def loaded(path, factory, **kwargs):
    network = factory(**kwargs)
    not_loaded, left = ms.load_param_into_net(network, ms.load_checkpoint(str(path)), strict_load=True)
    assert not not_loaded and not left
    return network.set_train(False)


def test_a_torchvision_resnet_converts_from_pth_and_safetensors_and_computes_what_pytorch_does(
        torch_resnet, tmp_path, capsys):
    name, model, (pth, safetensors), batch, expected = torch_resnet
    overrides = [*CIFAR, f"model={name}", "model.num_classes=10"]
    assert main([str(pth), str(tmp_path / "pth.ckpt"), *overrides]) == 0
    report = capsys.readouterr().out
    batch_norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert f"{4 * batch_norms} batch-norm names renamed" in report
    assert f"dropped: {batch_norms} (batch norm's step counter" in report
    assert "only in the source: 0" in report and "only in the network: 0" in report and "wrong shape: 0" in report
    assert main([str(safetensors), str(tmp_path / "st.ckpt"), *overrides]) == 0

    factory = ARCHITECTURES[name][1]
    from_pth, from_safetensors = (ms.load_checkpoint(str(tmp_path / path)) for path in ("pth.ckpt", "st.ckpt"))
    assert list(from_pth) == list(from_safetensors)
    for key in from_pth:
        np.testing.assert_array_equal(from_pth[key].asnumpy(), from_safetensors[key].asnumpy())
    for path, conv_impl in (("pth.ckpt", "native"), ("st.ckpt", "unfold")):  # the same weights, each convolution
        network = loaded(tmp_path / path, factory, num_classes=10, conv_impl=conv_impl)
        np.testing.assert_allclose(network(ms.Tensor(batch)).asnumpy(), expected, rtol=1e-4,
                                   atol=1e-4 * np.abs(expected).max())
    saved = ms.load_checkpoint(str(tmp_path / "st.ckpt"))
    source = model.state_dict()
    np.testing.assert_array_equal(saved["layer1.0.bn1.moving_variance"].asnumpy(),
                                  source["layer1.0.bn1.running_var"].numpy())
    np.testing.assert_array_equal(saved["layer1.0.bn1.gamma"].asnumpy(), source["layer1.0.bn1.weight"].numpy())


def test_wrapped_checkpoints_half_precision_and_a_new_head(tmp_path, capsys):
    """{'state_dict': {'module.' ...}} from DDP, Lightning's 'model.' prefix, bf16/fp16 tensors, --allow-missing."""
    state = torch_models.UserMLP(seed=2).state_dict()
    overrides = [*user_project(tmp_path), "--mapping", str(write_mapping(tmp_path))]
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 3, "optimizer": {}},
               tmp_path / "ddp.pth")
    assert main([str(tmp_path / "ddp.pth"), str(tmp_path / "ddp.ckpt"), *overrides]) == 0
    report = capsys.readouterr().out
    assert "entry 'state_dict', prefix 'module.' stripped; not tensors, ignored: epoch, optimizer" in report
    converted = ms.load_checkpoint(str(tmp_path / "ddp.ckpt"))
    np.testing.assert_array_equal(converted["body.0.weight"].asnumpy(), state["encoder.weight"].numpy())

    # Lightning: the module's attribute name is the prefix, next to an EMA copy; choose one with --prefix
    lightning = {**{f"model.{k}": v for k, v in state.items()}, **{f"ema_model.{k}": v * 0 for k, v in state.items()}}
    torch.save({"state_dict": lightning}, tmp_path / "lightning.ckpt")
    assert main([str(tmp_path / "lightning.ckpt"), str(tmp_path / "l.ckpt"), *overrides]) == 2
    assert "several models" in capsys.readouterr().err
    assert main([str(tmp_path / "lightning.ckpt"), str(tmp_path / "l.ckpt"), *overrides, "--prefix", "model."]) == 0
    np.testing.assert_array_equal(ms.load_checkpoint(str(tmp_path / "l.ckpt"))["body.2.bias"].asnumpy(),
                                  state["classifier.bias"].numpy())

    half = {"encoder.weight": state["encoder.weight"].to(torch.bfloat16),
            "encoder.bias": state["encoder.bias"].half(), "classifier.weight": state["classifier.weight"].half(),
            "classifier.bias": state["classifier.bias"].half()}
    save_file(half, str(tmp_path / "half.safetensors"))
    capsys.readouterr()
    assert main([str(tmp_path / "half.safetensors"), str(tmp_path / "half.ckpt"), *overrides,
                 "+model.num_classes=5", "--allow-missing", "body.2.*"]) == 0
    report = capsys.readouterr().out
    assert "dtype: 1 tensors bfloat16 -> float32" in report
    assert "dtype: 1 tensors float16 -> float32" in report  # the head (another shape) kept the network's init
    assert "kept the network's initialisation (--allow-missing): body.2.weight, body.2.bias" in report
    # every source tensor accounted for: 2 matched, the 2 of the head shaped differently (and allowed)
    assert "matched: 2 parameters" in report and "only in the source: 0" in report
    assert "wrong shape: 2: classifier.weight (3, 16) -> body.2.weight (5, 16), classifier.bias (3,) -> body.2.bias " \
           "(5,) (2 allowed by --allow-missing)" in report
    converted = ms.load_checkpoint(str(tmp_path / "half.ckpt"))
    assert converted["body.0.weight"].dtype == ms.float32 and converted["body.2.weight"].shape == (5, 16)
    np.testing.assert_array_equal(converted["body.0.weight"].asnumpy(), half["encoder.weight"].float().numpy())
    np.testing.assert_array_equal(converted["body.0.bias"].asnumpy(), half["encoder.bias"].float().numpy())


def user_project(tmp_path):
    """A user's config folder: tests.common.user_project's UserMLP and BlobData (names body.0, body.2)."""
    conf = tmp_path / "conf"
    for group in ("model", "data"):
        (conf / group).mkdir(parents=True, exist_ok=True)
    (conf / "model" / "user_mlp.yaml").write_text("_target_: tests.common.user_project.UserMLP\nhidden: 16\n")
    (conf / "data" / "user_blobs.yaml").write_text(
        "_target_: tests.common.user_project.BlobData\nbatch_size: 16\nsamples: 96\n")
    return [f"hydra.searchpath=[file://{conf}]", "model=user_mlp", "data=user_blobs"]


MAPPING = ("# the user's names -> trainkit's\n- {pattern: '^encoder\\.', replace: 'body.0.'}\n"
           "- {pattern: '^classifier\\.', replace: 'body.2.'}\n- {pattern: '^extra\\.', replace: null}\n")


def test_a_users_model_converts_with_a_mapping_file_and_fails_clearly_without(tmp_path, capsys):
    model = torch_models.UserMLP(seed=3)
    state = {**model.state_dict(), "extra.scale": torch.ones(1)}
    torch.save(state, tmp_path / "user.pth")
    overrides = user_project(tmp_path)
    assert main([str(tmp_path / "user.pth"), str(tmp_path / "user.ckpt"), *overrides]) == 2
    captured = capsys.readouterr()
    assert "only in the network: 4: body.0.weight, body.0.bias, body.2.weight, body.2.bias" in captured.out
    assert "only in the source: 5: encoder.weight" in captured.out
    assert captured.err.count("\n") == 1 and captured.err.startswith("trainkit: error: nothing was written to ")
    assert "--mapping" in captured.err and not (tmp_path / "user.ckpt").exists()

    assert main([str(tmp_path / "user.pth"), str(tmp_path / "user.ckpt"), *overrides,
                 "--mapping", str(write_mapping(tmp_path))]) == 0
    assert "dropped: 1 (dropped by a mapping rule)" in capsys.readouterr().out
    converted = ms.load_checkpoint(str(tmp_path / "user.ckpt"))
    np.testing.assert_array_equal(converted["body.2.weight"].asnumpy(), state["classifier.weight"].numpy())
    np.testing.assert_array_equal(converted["body.0.bias"].asnumpy(), state["encoder.bias"].numpy())


def write_mapping(folder):
    (folder / "mapping.yaml").write_text(MAPPING)
    return folder / "mapping.yaml"


class Unsafe:
    """Any class in a pickle: unpickling it would import and call code."""


def bad_sources(folder):
    """(name, path, expected message) for sources that must stop the conversion."""
    (folder / "corrupt.pth").write_bytes(b"not a zip, not a pickle" * 10)
    (folder / "corrupt.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken json")
    torch.save({"state_dict": {"conv1.weight": torch.ones(1)}, "hook": Unsafe()}, folder / "pickle.pth")
    return [("missing", folder / "absent.pth", "absent.pth does not exist"),
            ("corrupt pth", folder / "corrupt.pth", "corrupt.pth cannot be read: it is corrupt or not a PyTorch file"),
            ("corrupt safetensors", folder / "corrupt.safetensors",
             "cannot be read: it is corrupt or not a safetensors"),
            ("pickle", folder / "pickle.pth", "is refused: it holds more than tensors and plain containers (it needs "
                                              "tests.bridge.test_convert.Unsafe)")]


def test_bad_input_stops_with_one_line_and_writes_nothing(tmp_path, capsys):
    model = torch_models.resnet18(num_classes=10)
    torch.save(model.state_dict(), tmp_path / "good.pth")
    output = tmp_path / "out.ckpt"
    cases = [(name, [str(path), str(output), *CIFAR, "model=resnet18"], message)
             for name, path, message in bad_sources(tmp_path)]
    cases += [
        ("shape", [str(tmp_path / "good.pth"), str(output), *CIFAR, "model=resnet18", "model.num_classes=17"],
         "nothing was written to {out}: 2 parameters shaped differently (fc.weight (10, 512) -> fc.weight (17, 512)"),
        ("names", [str(tmp_path / "good.pth"), str(output), *CIFAR, "model=resnet50"],
         "nothing was written to {out}: "),
        ("unknown model", [str(tmp_path / "good.pth"), str(output), "model=resnet9"],
         "Could not find 'model/resnet9'"),
        ("mapping", [str(tmp_path / "good.pth"), str(output), "model=resnet18", "--mapping", str(tmp_path / "no.yaml")],
         "mapping file {tmp}/no.yaml does not exist"),
    ]
    for name, argv, message in cases:
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("trainkit: error: ") and err.count("\n") == 1, (name, err)
        assert message.format(out=output, tmp=tmp_path) in err, (name, err)
        assert not output.exists(), name
    assert "pickle can run any code" in main_error([str(tmp_path / "pickle.pth"), str(output), "model=resnet18"],
                                                   capsys)

    output.write_bytes(b"precious")
    assert main([str(tmp_path / "good.pth"), str(output), *CIFAR, "model=resnet18"]) == 2
    assert "already exists: nothing was written" in capsys.readouterr().err
    assert output.read_bytes() == b"precious"
    assert main([str(tmp_path / "good.pth"), str(output), *CIFAR, "model=resnet18", "--force"]) == 0
    assert "conv1.weight" in ms.load_checkpoint(str(output))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def main_error(argv, capsys):
    assert main(argv) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("planted, message", [
    ("swapped", ": bn1.running_var (-> bn1.moving_variance) is a batch norm's variance but holds"),
    ("nan", "layer1.0.conv1.weight (-> layer1.0.conv1.weight) holds 1 non-finite values"),
])
def test_values_no_trained_network_holds_are_refused_naming_the_tensor(planted, message, tmp_path, capsys):
    state = torch_models.resnet18(num_classes=10, seed=1).state_dict()
    if planted == "swapped":  # as a wrong mapping would lay them: the variance gets the mean's negative entries
        state["bn1.running_mean"], state["bn1.running_var"] = state["bn1.running_var"], state["bn1.running_mean"]
    else:
        state["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, tmp_path / "bad.pth")
    code = main([str(tmp_path / "bad.pth"), str(tmp_path / "bad.ckpt"), "model=resnet18", "model.num_classes=10"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and message in error[0] and not (tmp_path / "bad.ckpt").exists()


def test_a_conversion_logs_no_deprecation_warning_per_parameter(tmp_path):
    """mindspore.dtype_to_nptype logs "is deprecated" at every call, one line per parameter, at MindSpore's default
    log level (a fresh process: the suite raises the level)."""
    import os
    import subprocess
    import sys

    save_file(torch_models.UserMLP(seed=1).state_dict(), str(tmp_path / "user.safetensors"))
    environment = {key: value for key, value in os.environ.items() if key != "GLOG_v"}
    environment["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-m", "trainkit.convert", str(tmp_path / "user.safetensors"),
                           str(tmp_path / "user.ckpt"), *user_project(tmp_path), "--mapping",
                           str(write_mapping(tmp_path))], env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "deprecated" not in done.stdout + done.stderr
