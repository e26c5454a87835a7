"""A tiny run, trained once, then: profiled over a window (same weights), evaluated from its run directory, and
fine-tuned from (model.pretrained with a new head, model.freeze)."""
import json
import logging
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from tests.common.cifar10_files import write_cifar10
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.app.finetune import apply_finetuning
from trainkit.app.profiling import ProfileWindow, window_in_sinks
from trainkit.app.tool_config import build_network
from trainkit.errors import CheckpointError, ConfigError
from trainkit.tools.evaluate import main as evaluate
from trainkit.tools.export import export_checkpoint


def overrides(root, run_dir, *more):
    return ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", "data.image_size=8", "data.batch_size=8",
            "data.num_parallel_workers=1", f"data.root={root}", "data.val_fraction=0.2",
            "wrapper.ema_decay=0.5", "logger.progress=off",
            "trainer.epochs=1", f"run_dir={run_dir}", *more]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 5-step run of a small CNN on generated CIFAR-10 files, its weights, and its exported EMA weights."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    folder = tmp_path_factory.mktemp("trained")
    write_cifar10(str(folder / "cifar10"), train_per_file=10, test_records=16)
    result = train(compose_config(overrides(folder / "cifar10", folder / "run")))
    export_checkpoint(folder / "run" / "checkpoints" / "best.ckpt", folder / "exported.ckpt", weights="ema")
    weights = {p.name: p.asnumpy().copy() for p in result.network.get_parameters()}
    return folder, result, weights


def test_a_profiled_window_writes_its_files_and_leaves_the_weights_bitwise_equal(trained, caplog, monkeypatch):
    folder, _, weights = trained
    step_ends = []  # wall-clock ns at each step's end, to place the profiled operators in time
    original = ProfileWindow.on_train_step_end

    def timed(self, run_context):
        step_ends.append(time.time_ns())
        original(self, run_context)

    monkeypatch.setattr(ProfileWindow, "on_train_step_end", timed)
    with caplog.at_level(logging.INFO, logger="trainkit"):
        result = train(compose_config(overrides(folder / "cifar10", folder / "profiled", "trainer.profile.steps=2",
                                                "trainer.profile.start_step=2")))
    for name, value in weights.items():
        np.testing.assert_array_equal(result.network.parameters_dict()[name].asnumpy(), value, err_msg=name)
    [output] = (folder / "profiled" / "profile").glob("rank0_*_ascend_ms")
    assert (output / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").stat().st_size > 0  # where the docs say
    documented = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-pytorch.md").read_text()
    assert "`<run dir>/profile/rank<r>_<time>_ascend_ms/`" in documented
    assert "`ASCEND_PROFILER_OUTPUT/trace_view.json`" in documented
    [operators] = output.rglob("cpu_op_type_info_*.csv")
    rows = operators.read_text().splitlines()[1:]
    occurrences = {int(row.split(",")[1]) // int(row.split(",")[2]) for row in rows}
    assert occurrences == {2}  # every operator ran once per step per profiled step: the window's 2 steps only
    [timestamps] = output.rglob("cpu_op_execute_timestamp_*.txt")
    starts = [int(call.split(",")[0]) for line in timestamps.read_text().splitlines()
              for call in line.split(";")[2].split()]
    assert step_ends[0] < min(starts) and max(starts) < step_ends[2]  # inside steps 2 and 3
    logged = caplog.text
    assert f"trainer.profile: steps 2-3 profiled into {output}" in logged
    assert "trainer.profile: top operators by time: " in logged and "MatMul" in logged


def test_a_run_directory_evaluates_to_the_runs_own_final_metrics(trained, tmp_path):
    folder, result, _ = trained
    assert evaluate([str(folder / "run"), "--weights", "ema", "--output", str(tmp_path / "e.json")]) == 0
    evaluated = json.loads((tmp_path / "e.json").read_text())
    assert evaluated["checkpoint"].endswith("best.ckpt") and evaluated["samples"] == 10  # the validation records
    assert evaluated["accuracy"] == pytest.approx(result.metrics["ema_accuracy"])
    assert evaluated["loss"] == pytest.approx(result.metrics["ema_loss"], rel=1e-6)
    assert np.trace(np.array(evaluated["confusion_matrix"])) == round(10 * evaluated["accuracy"])


def test_pretrained_weights_fill_the_network_except_a_reinitialised_head(trained, caplog):
    folder, _, _ = trained
    exported = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(folder / "exported.ckpt")).items()}
    cfg = compose_config(overrides(folder / "cifar10", folder / "unused", "model.num_classes=12",
                                   f"model.pretrained={folder / 'exported.ckpt'}", "model.pretrained_reinit=[fc.*]"))
    fresh = {p.name: p.asnumpy() for p in build_network(cfg).get_parameters()}  # the model's own initialisation
    network = build_network(cfg)
    with caplog.at_level(logging.INFO, logger="trainkit"):
        apply_finetuning(cfg.model, network)
    assert "re-initialised as the model initialises them: fc.weight, fc.bias" in caplog.text
    for parameter in network.get_parameters():
        expected = fresh[parameter.name] if parameter.name.startswith("fc.") else exported[parameter.name]
        np.testing.assert_array_equal(parameter.asnumpy(), expected, err_msg=parameter.name)
    assert network.fc.weight.shape == (12, 16) and exported["fc.weight"].shape == (10, 16)

    strict = compose_config(overrides(folder / "cifar10", folder / "unused", "model.num_classes=12",
                                      f"model.pretrained={folder / 'exported.ckpt'}"))
    with pytest.raises(CheckpointError, match=r"model.pretrained: .*exported.ckpt does not fit the network \(shaped "
                                              r"differently: fc.weight \(10, 16\) in .*, \(12, 16\) in the network, "
                                              r"fc.bias .*model.pretrained_reinit"):
        apply_finetuning(strict.model, build_network(strict))

    ema = compose_config(overrides(folder / "cifar10", folder / "unused", "model.pretrained_weights=ema",
                                    f"model.pretrained={folder / 'run' / 'checkpoints' / 'best.ckpt'}"))
    network = build_network(ema)
    apply_finetuning(ema.model, network)
    saved = ms.load_checkpoint(str(folder / "run" / "checkpoints" / "best.ckpt"))
    for parameter in network.get_parameters():  # a training checkpoint's EMA shadows
        np.testing.assert_array_equal(parameter.asnumpy(), saved["ema." + parameter.name].asnumpy(),
                                      err_msg=parameter.name)


def test_fine_tuning_is_a_new_run_with_frozen_parameters_left_out_of_the_optimizer(trained):
    folder, _, _ = trained
    exported = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(folder / "exported.ckpt")).items()}
    result = train(compose_config(overrides(folder / "cifar10", folder / "tuned", "model.num_classes=12",
                                            f"model.pretrained={folder / 'exported.ckpt'}",
                                            "model.pretrained_reinit=[fc.*]", "model.freeze=[features.0.*]")))
    frozen = [p for p in result.network.trainable_params() if p.name.startswith("features.0.")]
    assert frozen == [] and all(not p.name.startswith("features.0.") for p in result.optimizer.parameters)
    for name, parameter in result.network.parameters_dict().items():
        if name.startswith("features.0.") and "moving_" not in name:  # BN statistics still move in train mode
            np.testing.assert_array_equal(parameter.asnumpy(), exported[name], err_msg=name)
    changed = result.network.parameters_dict()["features.1.0.weight"].asnumpy()
    assert not np.array_equal(changed, exported["features.1.0.weight"])  # the rest trained
    assert result.metrics["optimizer_steps"] == 5  # a fresh optimizer: this run's 5 steps only


@pytest.mark.parametrize("fixed", [False, True])
def test_frozen_batch_norms_keep_their_statistics_only_with_freeze_batch_norm(trained, fixed):
    """The default moves a frozen layer's batch-norm statistics (PyTorch's train()); freeze_batch_norm keeps them
    bitwise, as backbone.eval() does, while the layers not frozen still move theirs."""
    folder, _, _ = trained
    exported = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(folder / "exported.ckpt")).items()}
    result = train(compose_config(overrides(folder / "cifar10", folder / f"bn{fixed}",
                                            f"model.pretrained={folder / 'exported.ckpt'}",
                                            "model.freeze=[features.0.*]", f"+model.freeze_batch_norm={fixed}")))
    values = {name: p.asnumpy() for name, p in result.network.parameters_dict().items()}
    frozen = [name for name in values if name.startswith("features.0.") and "moving_" in name]
    assert frozen
    assert all(np.array_equal(values[name], exported[name]) for name in frozen) == fixed
    assert not np.array_equal(values["features.1.1.moving_mean"], exported["features.1.1.moving_mean"])


def test_pretrained_weights_under_resume_do_not_announce_a_fresh_start(trained, caplog):
    folder, _, _ = trained
    pretrained = f"model.pretrained={folder / 'exported.ckpt'}"
    cfg = compose_config(overrides(folder / "cifar10", folder / "unused", pretrained))
    for resume, said in [
            (None, "a new run: optimizer, schedule, data order and EMA start fresh"),
            ("auto", "trainer.resume=auto: the checkpoint it resumes from replaces them, if it finds one")]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trainkit"):
            apply_finetuning(cfg.model, build_network(cfg), resume)
        assert said in caplog.text
        assert ("start fresh" in caplog.text) == (resume is None)


def test_bad_fine_tuning_and_profile_settings_stop_before_anything_is_written(trained):
    folder, _, _ = trained
    cases = [(["model.pretrained=/nonexistent.ckpt"], CheckpointError, "/nonexistent.ckpt does not exist"),
             ([f"model.pretrained={folder / 'exported.ckpt'}", "model.pretrained_weights=shadow"], ConfigError,
              "model.pretrained_weights=shadow is not valid"),
             (["model.freeze=[layer9.*]"], ConfigError, r"model.freeze: layer9.\* matches no trainable parameter"),
             (["trainer.profile.steps=2", "trainer.profile.start_step=0"], ConfigError,
              "trainer.profile.start_step must be an int >= 1")]
    for index, (more, error, message) in enumerate(cases):
        run_dir = folder / f"bad{index}"
        with pytest.raises(error, match=message):
            train(compose_config(overrides(folder / "cifar10", run_dir, *more)))
        assert not (run_dir / ".hydra").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("start, steps, sink_size", [(5, 3, 4), (3, 4, 4), (1, 1, 10), (9, 2, 4), (4, 1, 1)])
def test_in_sink_mode_the_window_is_rounded_out_to_whole_sinks(start, steps, sink_size):
    sinks = sorted({(step - 1) // sink_size for step in range(start, start + steps)})  # the sinks the steps fall in
    first, count = window_in_sinks(start, steps, sink_size)
    assert list(range(first, first + count)) == sinks
