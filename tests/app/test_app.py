"""The app end to end, in-process: generated CIFAR-10 files, 8x8 images, a tiny CNN; both modes, sink on/off."""

import mindspore as ms
import numpy as np
import pytest

from tests.common.callbacks import read_jsonl
from tests.common.cifar10_files import RECORD_BYTES, validation_indices, write_cifar10
from tests.common.tensorboard_events import read_scalars
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.errors import ConfigError, DataError

TRAIN_PER_FILE, TEST_RECORDS, BATCH = 10, 20, 8
STEPS_PER_EPOCH = 5 * TRAIN_PER_FILE * 4 // 5 // BATCH  # 5: data.val_fraction=0.2 holds 10 of the 50 out
MEAN, STD = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2023, 0.1994, 0.2010])


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar10")
    written = write_cifar10(str(root), train_per_file=TRAIN_PER_FILE, test_records=TEST_RECORDS, seed=3)
    return root, written


def validation(written):
    return validation_indices(written["train_labels"], 0.2)


def tiny(root, run_dir, *overrides):
    """The seed recipe shrunk to seconds: small_cnn of width 4 on 8x8 images."""
    return compose_config([
        "recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", f"data.root={root}", "data.val_fraction=0.2",
        "data.image_size=8",
        f"data.batch_size={BATCH}", "data.num_parallel_workers=1", "trainer.epochs=2", "logger.log_every_n_steps=1",
        "logger.progress=log", f"run_dir={run_dir}", *overrides])


def numpy_accuracy(network, images, labels):
    """Accuracy of `network` on the eval images, with the seed's eval transform written in NumPy (32 -> 8 by
    MindSpore's Resize is the one step taken from the pipeline: its output is compared in tests/data)."""
    from mindspore.dataset import vision

    network.set_train(False)
    resized = np.stack([vision.Resize(8)(image) for image in images]).astype(np.float64)
    x = ((resized / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2).astype(np.float32)
    logits = network(ms.Tensor(x)).asnumpy()
    return float(np.mean(logits.argmax(axis=1) == labels))


@pytest.mark.parametrize("sink", [False, True], ids=["no_sink", "sink"])
def test_app_trains_end_to_end_and_records_events_metrics_and_checkpoints(mode, sink, cifar10, tmp_path):
    root, written = cifar10
    overrides = [f"trainer.mode={mode}", f"trainer.dataset_sink_mode={sink}"]
    if sink:
        overrides.append("trainer.sink_size=1")  # checked against the epoch; on CPU MindSpore does not sink
    result = train(tiny(root, tmp_path, *overrides))

    epochs = 2
    assert result.metrics["optimizer_steps"] == epochs * STEPS_PER_EPOCH
    accuracy = numpy_accuracy(result.network, written["train_images"][validation(written)],
                               written["train_labels"][validation(written)])
    assert result.metrics["accuracy"] == pytest.approx(accuracy)
    assert np.isfinite(result.metrics["loss"]) and np.isfinite(result.metrics["train_loss"])

    records = read_jsonl(tmp_path / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == list(range(1, epochs * STEPS_PER_EPOCH + 1))
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["epoch"] for r in evals] == [1, 2]
    assert evals[-1]["eval/accuracy"] == pytest.approx(accuracy)

    scalars = read_scalars(tmp_path / "tensorboard")
    for tag in ("train/loss", "train/learning_rate", "train/loss_scale", "train/grad_norm", "train/skipped_steps",
                "train/samples_per_second", "eval/accuracy", "eval/loss"):
        assert tag in scalars, tag
    assert [step for step, _ in scalars["train/loss"]] == train_steps
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([r["train/loss"] for r in records
                                                                    if "train/loss" in r], rel=1e-6)
    assert all(v == pytest.approx(0.001) for _, v in scalars["train/learning_rate"])  # the seed's constant lr

    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "best.ckpt" in checkpoints and not any(name.endswith(".tmp") for name in checkpoints)
    assert sum(name.endswith(".ckpt") and name != "best.ckpt" for name in checkpoints) == epochs
    saved = ms.load_checkpoint(str(tmp_path / "checkpoints" / "best.ckpt"))
    assert "beta1_power" in saved or any(name.startswith("moment1.") for name in saved)  # optimizer state too


def test_every_wrapper_feature_through_the_app_reports_live_and_ema_metrics(graph_mode, cifar10, tmp_path):
    root, written = cifar10
    result = train(tiny(root, tmp_path, "wrapper.accumulation_steps=5", "wrapper.ema_decay=0.5",
                        "wrapper.max_grad_norm=1.0", "wrapper.loss_scale=dynamic", "wrapper.loss_scale_value=1024",
                        "amp=O2", "lr_schedule=cosine", "lr_schedule.warmup_epochs=1",
                        "trainer.best_metric=ema_accuracy"))
    assert result.metrics["optimizer_steps"] == 2  # two epochs of five micro-batches, one update per window
    assert {"accuracy", "loss", "ema_accuracy", "ema_loss"} <= set(result.metrics)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert any("eval_ema/accuracy" in r for r in records)
    learning_rates = [r["train/learning_rate"] for r in records if "train/learning_rate" in r]
    assert learning_rates[0] == pytest.approx(0.001)  # warm-up: update 1 of 1 -> the full lr
    assert (tmp_path / "checkpoints" / "best.ckpt").exists()


def test_a_users_own_model_dataset_and_wrapper_subclass_run_through_the_same_command(graph_mode, tmp_path):
    conf = tmp_path / "conf"  # a user's config folder, as the README shows
    for group in ("model", "data", "recipe"):
        (conf / group).mkdir(parents=True)
    (conf / "model" / "user_mlp.yaml").write_text("_target_: tests.common.user_project.UserMLP\nhidden: 16\n")
    (conf / "data" / "user_blobs.yaml").write_text(
        "_target_: tests.common.user_project.BlobData\nbatch_size: 16\nsamples: 96\n")
    (conf / "recipe" / "user_recipe.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: user_mlp\n  - override /data: user_blobs\n"
        "wrapper:\n  _target_: tests.common.user_project.CountingWrapper\n"
        "optimizer:\n  lr: 0.01\ntrainer:\n  epochs: 3\n  save_checkpoints: false\n")
    cfg = compose_config([f"hydra.searchpath=[file://{conf}]", "recipe=user_recipe", "logger=quiet",
                          f"run_dir={tmp_path / 'run'}"])
    result = train(cfg)
    assert type(result.wrapper).__name__ == "CountingWrapper" and type(result.network).__name__ == "UserMLP"
    assert int(result.wrapper.applied_updates.asnumpy()) == 3 * 96 // 16
    assert result.metrics["accuracy"] > 0.9  # three well separated blobs


def test_sink_size_larger_than_an_epoch_stops_before_compiling(cifar10, tmp_path):
    root, _ = cifar10
    with pytest.raises(ConfigError, match=r"trainer.sink_size=50 is not valid for an epoch of 5 steps: use -1"):
        train(tiny(root, tmp_path, "trainer.dataset_sink_mode=true", "trainer.sink_size=50"))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_model_channels_must_match_the_data(cifar10, tmp_path):
    root, _ = cifar10
    with pytest.raises(ConfigError, match=r"model.in_channels=1 but the data has 3-channel images"):
        train(tiny(root, tmp_path, "model.in_channels=1"))


def test_missing_data_names_where_it_looked_and_how_to_fix_it(tmp_path):
    with pytest.raises(DataError) as error:
        train(tiny(tmp_path / "nowhere", tmp_path / "run"))
    message = str(error.value)
    assert str(tmp_path / "nowhere") in message and "data.download=true" in message


def test_corrupt_data_file_is_named(tmp_path):
    root = tmp_path / "data"
    write_cifar10(str(root), train_per_file=TRAIN_PER_FILE, test_records=TEST_RECORDS)
    broken = root / "cifar-10-batches-bin" / "data_batch_3.bin"
    broken.write_bytes(broken.read_bytes()[:-(RECORD_BYTES // 2)])
    with pytest.raises(DataError, match="data_batch_3.bin"):
        train(tiny(root, tmp_path / "run"))


@pytest.mark.slow  # 16 s; the recipe composes (test_config), ResNet-50 trains (tests/models/test_resnet.py)
def test_the_seed_recipe_runs_resnet50_at_32x32_on_a_cpu(graph_mode, tmp_path):
    root = tmp_path / "data"
    write_cifar10(str(root), train_per_file=2, test_records=4)
    cfg = compose_config(["recipe=resnet50_cifar10", f"data.root={root}", "data.val_fraction=0.2", "data.image_size=32",
                          "data.batch_size=2",
                          "data.num_parallel_workers=1", "trainer.epochs=1", "trainer.save_checkpoints=false",
                          "logger=quiet", f"run_dir={tmp_path / 'run'}"])
    result = train(cfg)
    assert type(result.network).__name__ == "ResNet" and result.network.fc.weight.shape == (10, 2048)
    assert result.metrics["optimizer_steps"] == 4 and np.isfinite(result.metrics["train_loss"])  # 8 of 10 train


def test_a_directory_that_holds_a_run_is_refused_and_left_unchanged(cifar10, tmp_path):
    root, _ = cifar10
    train(tiny(root, tmp_path, "trainer.epochs=1"))
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    with pytest.raises(ConfigError, match=f"{tmp_path} already holds a run .*nothing was changed"):
        train(tiny(root, tmp_path, "trainer.epochs=1", "model.width=8"))
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


@pytest.mark.parametrize("overrides, message", [
    (["wrapper.accumulation_steps=11"],
     "wrapper.accumulation_steps=11 is not valid for a run of 10 micro-batches (2 epochs of 5)"),
    (["trainer.sink_size=7"], "trainer.sink_size=7 is not valid for an epoch of 5 steps"),  # even with sink mode off
    (["parallel=semi_auto_parallel"], "parallel.mode=semi_auto_parallel runs on Ascend and GPU only"),
    (["lr_schedule=cosine", "lr_schedule.warmup_epochs=3"], "lr_schedule.warmup_epochs must be in [0, epochs=2]"),
    (["data.image_size=4"], "data.image_size must be an int >= 8; got 4"),
])
def test_impossible_combinations_stop_before_training_naming_the_key(overrides, message, cifar10, tmp_path):
    root, _ = cifar10
    with pytest.raises(ConfigError) as error:
        train(tiny(root, tmp_path, *overrides))
    assert message in str(error.value)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / ".hydra").exists()
