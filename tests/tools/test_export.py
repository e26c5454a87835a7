"""python -m trainkit.export: the network alone, live or EMA weights, loadable strictly into the bare model."""
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.common.cifar10_files import write_cifar10
from tests.common.models import TinyMLP, batches, loss_network, run
from trainkit import TrainingWrapper
from trainkit.app.finetune import model_arguments
from trainkit.errors import CheckpointError
from trainkit.rundir.weights import network_parameter_names
from trainkit.tools.export import export_checkpoint, main

MLP_NAMES = {"fc1.weight", "fc1.bias", "bn.gamma", "bn.beta", "bn.moving_mean", "bn.moving_variance", "fc2.weight",
             "fc2.bias"}


@pytest.fixture(scope="module")
def training_checkpoint(tmp_path_factory):
    """A wrapper with every kind of training state, trained a few steps and saved as the app saves it."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = TinyMLP(batch_norm=True)
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.05)
    wrapper = TrainingWrapper(loss_network(net), optimizer, accumulation_steps=2, ema_decay=0.5,
                              loss_scale=ms.amp.DynamicLossScaler(2.0 ** 8, 2, 5), skip_nonfinite=True,
                              max_grad_norm=1.0)
    run(wrapper, batches(5, 4))  # ends inside a window: _grad_sum and micro_step are not zero
    path = tmp_path_factory.mktemp("train") / "trainkit-1_5.ckpt"
    ms.save_checkpoint(wrapper, str(path))
    return path


def load_strictly(path, network):
    not_loaded, left_over = ms.load_param_into_net(network, ms.load_checkpoint(str(path)), strict_load=True)
    return not_loaded, left_over


@pytest.mark.parametrize("weights", ["live", "ema"])
def test_exported_network_loads_strictly_with_the_source_values(training_checkpoint, weights, tmp_path):
    source = ms.load_checkpoint(str(training_checkpoint))
    assert {"moment1.fc1.weight", "_grad_sum.fc1.weight", "ema.fc1.weight", "loss_scale.scale_value", "micro_step",
            "ema_num_updates", "global_step", "beta1_power", "_window_start.bn.moving_mean"} <= set(source)
    output = export_checkpoint(training_checkpoint, tmp_path / "model.ckpt", weights=weights)
    exported = ms.load_checkpoint(str(output))
    assert set(exported) == MLP_NAMES
    prefix = "ema." if weights == "ema" else ""
    for name in MLP_NAMES:
        np.testing.assert_array_equal(exported[name].asnumpy(), source[prefix + name].asnumpy(), err_msg=name)
    assert not np.array_equal(source["ema.fc1.weight"].asnumpy(), source["fc1.weight"].asnumpy())  # they differ

    _, training_state = load_strictly(training_checkpoint, TinyMLP(batch_norm=True))
    assert "moment1.fc1.weight" in training_state  # the check below would see wrapper keys
    bare = TinyMLP(batch_norm=True, seed=5)
    not_loaded, left_over = load_strictly(output, bare)
    assert not not_loaded and not left_over
    for name, parameter in bare.parameters_dict().items():
        np.testing.assert_array_equal(parameter.asnumpy(), source[prefix + name].asnumpy(), err_msg=name)
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]  # no temporary file left


@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_an_app_checkpoint_exports_into_the_apps_model(graph_mode, optimizer, tmp_path):
    """The real key names of the app's epoch checkpoint (Momentum's ``momentum``/``moments.*``, AdamW's
    ``adam_m.*``) and a model built from the same config."""
    from hydra.utils import instantiate

    from trainkit.app import train
    from trainkit.app.config import compose_config

    root = tmp_path / "cifar10"
    write_cifar10(str(root), train_per_file=10, test_records=8)
    overrides = ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", "data.image_size=8",
                 "data.batch_size=8", "data.num_parallel_workers=1", f"data.root={root}", "data.val_fraction=0.2",
                 f"optimizer={optimizer}",
                 "wrapper.ema_decay=0.9", "wrapper.accumulation_steps=2", "logger.progress=off",
                 "trainer.epochs=2", f"run_dir={tmp_path / 'run'}"]
    result = train(compose_config(overrides))
    checkpoint = tmp_path / "run" / "checkpoints" / "trainkit-2_5.ckpt"
    source = ms.load_checkpoint(str(checkpoint))
    assert main([str(checkpoint), str(tmp_path / "ema.ckpt"), "--weights", "ema"]) == 0
    names = {p.name for p in result.network.get_parameters()}
    model = instantiate(model_arguments(compose_config(overrides).model), num_classes=10, in_channels=3)
    not_loaded, left_over = load_strictly(tmp_path / "ema.ckpt", model)
    assert not not_loaded and not left_over
    assert {p.name for p in model.get_parameters()} == names
    for name, parameter in model.parameters_dict().items():
        np.testing.assert_array_equal(parameter.asnumpy(), source["ema." + name].asnumpy(), err_msg=name)


def test_wrapper_state_names_are_recognised():
    names = ["features.0.weight", "fc.bias", "moment1.features.0.weight", "moment1.fc.bias", "moments.fc.bias",
             "adam_v.fc.bias", "global_step", "learning_rate", "beta1_power", "momentum", "loss_scale.scale_value",
             "loss_scale.counter", "micro_step", "_grad_sum.fc.bias", "_window_start.bn.moving_mean", "_loss_sum",
             "ema.fc.bias", "ema.scale", "scale", "ema_num_updates", "bn.moving_mean"]
    assert network_parameter_names(names) == ["features.0.weight", "fc.bias", "scale", "bn.moving_mean"]


def test_an_existing_output_is_kept_unless_forced(training_checkpoint, tmp_path, capsys):
    output = tmp_path / "model.ckpt"
    output.write_bytes(b"keep me")
    assert main([str(training_checkpoint), str(output)]) == 2
    assert "already exists: nothing was written" in capsys.readouterr().err and output.read_bytes() == b"keep me"
    assert main([str(training_checkpoint), str(output), "--force"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert set(ms.load_checkpoint(str(output))) == MLP_NAMES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_an_output_whose_suffix_names_no_format_is_one_line_before_any_work(training_checkpoint, tmp_path, capsys):
    """``model.onxx`` (a typo of .onnx) had written a checkpoint under that name, then crashed reading it back (a
    traceback, exit status 1). Mutation caught: the suffix check left out."""
    from trainkit.export import main as command

    for name in ("model.onxx", "model", "model.ckpt.bak", "model.CKPT"):  # MindSpore reads back .ckpt alone
        assert command([str(training_checkpoint), str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err == (f"trainkit: error: {tmp_path / name}: the output's suffix names no format trainkit writes: "
                       ".ckpt (an inference checkpoint), .mindir or .onnx (a model for serving), .safetensors, .pth "
                       "or .pt (PyTorch weights); nothing was written\n"), err
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_name_the_file(tmp_path, capsys):
    missing = tmp_path / "missing.ckpt"
    with pytest.raises(CheckpointError, match=f"checkpoint {missing} does not exist"):
        export_checkpoint(missing, tmp_path / "out.ckpt")
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(os.urandom(64))
    assert main([str(corrupt), str(tmp_path / "out.ckpt")]) == 2
    assert f"trainkit: error: checkpoint {corrupt} cannot be read" in capsys.readouterr().err

    net = TinyMLP()
    wrapper = TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), 0.1))
    no_ema = tmp_path / "no_ema.ckpt"
    ms.save_checkpoint(wrapper, str(no_ema))
    with pytest.raises(CheckpointError, match=f"{no_ema} holds no EMA weights"):
        export_checkpoint(no_ema, tmp_path / "out.ckpt", weights="ema")
    assert not (tmp_path / "out.ckpt").exists()
    with pytest.raises(ValueError, match="weights must be one of live, ema"):
        export_checkpoint(no_ema, tmp_path / "out.ckpt", weights="shadow")


def test_a_run_directory_exports_its_best_checkpoint_as_the_serving_formats_do(digits_run, tmp_path, capsys):
    """``python -m trainkit.export RUN model.ckpt`` (and ``model.safetensors``) read the run's best.ckpt, as
    ``RUN model.onnx`` does; it was refused (``checkpoint RUN is not a file``). The written weights are best.ckpt's
    network parameters, read here by MindSpore's own loader."""
    from trainkit.export import main as command

    best = ms.load_checkpoint(str(digits_run / "checkpoints" / "best.ckpt"))
    output = tmp_path / "model.ckpt"
    assert command([str(digits_run), str(output)]) == 0
    assert f"from {digits_run / 'checkpoints' / 'best.ckpt'}" in capsys.readouterr().out
    written = ms.load_checkpoint(str(output))
    assert written and all(np.array_equal(value.asnumpy(), best[name].asnumpy()) for name, value in written.items())
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    assert command([str(digits_run), str(tmp_path / "model.safetensors")]) == 0
    assert f"from {digits_run / 'checkpoints' / 'best.ckpt'}" in capsys.readouterr().out
    tensors = {name: value for name, value in load_file(str(tmp_path / "model.safetensors")).items()
               if not name.endswith("num_batches_tracked")}  # PyTorch's batch-norm counters, added as 0
    assert sorted(float(value.astype(np.float64).sum()) for value in tensors.values()) == pytest.approx(
        sorted(float(best[name].asnumpy().astype(np.float64).sum()) for name in written))


def test_every_export_form_accepts_trust(tmp_path, capsys):
    """--trust MODULE, which the .onnx/.mindir forms need for a run of your own project, is accepted by the
    weights-only forms too (.ckpt, --to torch), which read no stored config: one command line fits every form.

    Mutation caught: --trust left out of either parser (argparse's usage error, exit status 2)."""
    from safetensors.numpy import load_file

    from trainkit.export import main as export

    values = {"fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": np.ones(2, np.float32)}
    ms.save_checkpoint([{"name": name, "data": ms.Tensor(value)} for name, value in values.items()],
                       str(tmp_path / "model.ckpt"))
    assert export([str(tmp_path / "model.ckpt"), str(tmp_path / "w.safetensors"), "--to", "torch",
                   "--trust", "my_project"]) == 0
    back = load_file(str(tmp_path / "w.safetensors"))
    assert set(back) == set(values) and all(np.array_equal(back[name], values[name]) for name in values)
    assert export([str(tmp_path / "model.ckpt"), str(tmp_path / "net.ckpt"), "--trust", "my_project"]) == 0
    assert {name: value.asnumpy().tolist() for name, value in ms.load_checkpoint(str(tmp_path / "net.ckpt")).items()
            } == {name: value.tolist() for name, value in values.items()}
    assert "error" not in capsys.readouterr().err
