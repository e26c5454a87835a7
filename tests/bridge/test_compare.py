"""python -m trainkit.compare: the layer table, and the first layer where trainkit and PyTorch part ways."""
import csv
import json

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.common import torch_models  # noqa: E402
from trainkit.bridge.compare import main  # noqa: E402
from trainkit.bridge.convert import main as convert  # noqa: E402
from trainkit.models import resnet18  # noqa: E402

OVERRIDES = ["recipe=resnet50_cifar10", "data.image_size=16", "model=resnet18", "model.num_classes=10"]
TORCH = ["--torch-model", "tests.common.torch_models:resnet18", "--torch-arg", "num_classes=10"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A random torchvision-layout ResNet-18's weights and their conversion."""
    folder = tmp_path_factory.mktemp("compare")
    torch.save(torch_models.resnet18(num_classes=10, seed=4).state_dict(), folder / "weights.pth")
    assert convert([str(folder / "weights.pth"), str(folder / "weights.ckpt"), *OVERRIDES]) == 0
    return folder


def planted(converted, folder, name, change):
    """The converted checkpoint with one mistake in it, written into `folder`."""
    values = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(converted / "weights.ckpt")).items()}
    change(values)
    path = folder / f"{name}.ckpt"
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in values.items()], str(path))
    return path


def transpose_conv(values):
    values["layer2.0.conv2.weight"] = values["layer2.0.conv2.weight"].transpose(0, 1, 3, 2).copy()


def swap_mean_and_variance(values):
    mean, variance = "layer1.1.bn1.moving_mean", "layer1.1.bn1.moving_variance"
    values[mean], values[variance] = values[variance], values[mean]


def read_csv(path):
    with open(path, newline="") as stream:
        return {row["name"]: row for row in csv.DictReader(stream)}


def verdict(argv, folder):
    code = main([*argv, "--json", str(folder / "verdict.json")])
    return code, json.loads((folder / "verdict.json").read_text())


def test_converted_weights_agree_with_pytorch_layer_by_layer(converted, tmp_path):
    code, result = verdict([str(converted / "weights.ckpt"), *OVERRIDES, *TORCH, "--torch-weights",
                            str(converted / "weights.pth")], tmp_path)
    assert code == 0 and result["first_divergence"] is None
    rows = {row["name"]: row for row in result["layers"]}
    assert result["paired_layers"] == len(rows) >= 60  # every layer has its PyTorch twin, reused ReLUs included
    assert rows["layer1.0.relu#2"]["torch_name"] == "layer1.0.relu#2"
    assert max(row["max_rel_diff"] for row in rows.values()) <= 1e-4


@pytest.mark.parametrize("mistake, first", [(transpose_conv, "layer2.0.conv2"),
                                            (swap_mean_and_variance, "layer1.1.bn1")])
def test_a_planted_mistake_is_named_as_the_first_diverging_layer(converted, tmp_path, capsys, mistake, first):
    wrong = planted(converted, tmp_path, mistake.__name__, mistake)
    code, result = verdict([str(wrong), *OVERRIDES, *TORCH, "--torch-weights", str(converted / "weights.pth")],
                           tmp_path)
    assert code == 1 and result["first_divergence"] == first
    assert f"first layer beyond the tolerance (0.0001 relative): {first} (torch {first})" in capsys.readouterr().out
    rows = [row["name"] for row in result["layers"]]
    before = rows[:rows.index(first)]
    assert all(row["max_rel_diff"] <= 1e-4 for row in result["layers"] if row["name"] in before)

    network = resnet18(num_classes=10)  # the final row's differences, recomputed from both outputs
    ms.load_param_into_net(network, ms.load_checkpoint(str(wrong)), strict_load=True)
    batch = np.random.default_rng(0).uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32)
    ours = network.set_train(False)(ms.Tensor(batch)).asnumpy().astype(np.float64)
    model = torch_models.resnet18(num_classes=10)
    model.load_state_dict(torch.load(converted / "weights.pth"))
    with torch.no_grad():
        theirs = model.eval()(torch.from_numpy(batch)).numpy().astype(np.float64)
    final = next(row for row in result["layers"] if row["name"] == "(network)")
    assert final["max_abs_diff"] == pytest.approx(np.abs(ours - theirs).max(), rel=1e-4)
    assert final["max_rel_diff"] == pytest.approx(np.abs(ours - theirs).max() / np.abs(theirs).max(), rel=1e-4)


def test_the_table_alone_describes_each_layer_and_flags_non_finite_values(converted, tmp_path, capsys):
    """Without PyTorch: the statistics of each output, checked on the network's own output with NumPy."""
    csv_path = tmp_path / "table.csv"
    assert main([str(converted / "weights.ckpt"), *OVERRIDES, "--batch-size", "3", "--seed", "5",
                 "--csv", str(csv_path)]) == 0
    rows = read_csv(csv_path)
    network = resnet18(num_classes=10)
    ms.load_param_into_net(network, ms.load_checkpoint(str(converted / "weights.ckpt")), strict_load=True)
    batch = np.random.default_rng(5).uniform(-1, 1, (3, 3, 16, 16)).astype(np.float32)
    logits = network.set_train(False)(ms.Tensor(batch)).asnumpy().astype(np.float64)
    final = rows["(network)"]
    assert final["shape"] == "3x10" and final["nonfinite"] == "0"
    for column, value in (("mean", logits.mean()), ("std", logits.std()), ("min", logits.min()),
                          ("max", logits.max())):
        assert float(final[column]) == pytest.approx(value, rel=1e-5, abs=1e-6), column

    def negative_variance(values):
        values["layer3.0.bn2.moving_variance"][:4] = -1.0  # sqrt of a negative number: NaN from there on

    capsys.readouterr()
    wrong = planted(converted, tmp_path, "nan", negative_variance)
    assert main([str(wrong), *OVERRIDES, "--csv", str(csv_path)]) == 1  # batch 2 of 16x16: layer3 is 1x1
    assert "non-finite values first in layer3.0.bn2" in capsys.readouterr().out
    rows = read_csv(csv_path)
    assert int(rows["layer3.0.bn2"]["nonfinite"]) == 2 * 4 * 1 * 1 and rows["layer3.0.conv2"]["nonfinite"] == "0"


def test_bad_input_is_one_line(converted, tmp_path, capsys):
    cases = [([str(tmp_path / "absent.ckpt"), *OVERRIDES], "absent.ckpt does not exist"),
             ([str(converted / "weights.ckpt"), *OVERRIDES, "--torch-model", "nowhere:resnet18", "--torch-weights",
               str(converted / "weights.pth")],
              "--torch-model nowhere:resnet18: cannot import nowhere"),
             ([str(converted / "weights.ckpt"), *OVERRIDES, *TORCH], "--torch-model needs the PyTorch weights"),
             ([str(converted / "weights.ckpt"), "recipe=resnet50_cifar10", "model=resnet50"],
              "does not fit the network"),
             ([str(converted / "weights.ckpt"), *OVERRIDES, *TORCH, "--torch-arg", "num_classes=3", "--torch-weights",
               str(converted / "weights.pth")], "does not load into the PyTorch model: Error(s) in loading")]
    for argv, message in cases:
        assert main(argv) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("trainkit: error: ") and err.count("\n") == 1 and message in err, err


def test_layers_left_unpaired_are_reported_and_fail_the_comparison_unless_allowed(tmp_path, capsys):
    """Without the mapping, no layer with parameters pairs up: nothing was compared, so nothing may "agree"."""
    from tests.bridge.test_convert import user_project, write_mapping

    torch.save(torch_models.UserMLP(seed=1).state_dict(), tmp_path / "user.pth")
    mapping = write_mapping(tmp_path)
    overrides = user_project(tmp_path)
    assert convert([str(tmp_path / "user.pth"), str(tmp_path / "user.ckpt"), *overrides, "--mapping",
                    str(mapping)]) == 0
    user = [str(tmp_path / "user.ckpt"), *overrides, "--torch-model", "tests.common.torch_models:UserMLP",
            "--torch-arg", "seed=1", "--torch-weights", str(tmp_path / "user.pth"), "--input-shape", "4"]
    capsys.readouterr()
    code, result = verdict(user, tmp_path)
    out = capsys.readouterr().out
    assert code == 1 and "unpaired layers with parameters: 2 here (body.0, body.2), 2 in PyTorch (encoder, " \
                         "classifier)" in out
    assert result["unpaired_here"] == ["body.0", "body.2"] and "\nagree:" not in out
    assert verdict([*user, "--allow-unpaired"], tmp_path)[0] == 0
    code, result = verdict([*user, "--mapping", str(mapping)], tmp_path)
    assert code == 0 and result["unpaired_here"] == [] and result["unpaired_in_torch"] == []
    assert "unpaired layers with parameters: 0 here, 0 in PyTorch" in capsys.readouterr().out


def test_the_tools_prepare_the_data_module_as_the_app_does(tmp_path, capsys):
    """num_classes set by the data module's prepare() fills the model's null key, in convert and compare alike."""
    from tests.bridge.test_convert import write_mapping

    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "data").mkdir()
    (conf / "model" / "late.yaml").write_text("_target_: tests.common.user_project.UserMLP\nnum_classes: null\n")
    (conf / "data" / "late.yaml").write_text("_target_: tests.common.port_data.LateClasses\n")
    overrides = [f"hydra.searchpath=[file://{conf}]", "model=late", "data=late"]
    torch.save(torch_models.UserMLP(seed=2).state_dict(), tmp_path / "user.pth")
    mapping = ["--mapping", str(write_mapping(tmp_path))]
    assert convert([str(tmp_path / "user.pth"), str(tmp_path / "user.ckpt"), *overrides, *mapping]) == 0
    code, result = verdict([str(tmp_path / "user.ckpt"), *overrides, *mapping, "--torch-model",
                            "tests.common.torch_models:UserMLP", "--torch-arg", "seed=2", "--torch-weights",
                            str(tmp_path / "user.pth"), "--input-shape", "4"], tmp_path)
    assert code == 0 and result["first_divergence"] is None


def test_compare_refuses_a_mixed_precision_level_it_would_not_test(converted, tmp_path, capsys):
    code = main([str(converted / "weights.ckpt"), *OVERRIDES, "amp=O2", *TORCH, "--torch-weights",
                 str(converted / "weights.pth")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and error[0].startswith("trainkit: error: amp=O2: compare runs both")
