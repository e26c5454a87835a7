"""A user's own project outside trainkit (tests/user_project/, copied into a temporary directory): a regression data
module with its own column names, a TrainingWrapper subclass with an argument and a logged scalar of its own, a
callback, MSE loss and MAE/MSE metrics with the best checkpoint by MAE -- in-process and through python -m trainkit.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import yaml

from tests.common.callbacks import read_jsonl
from tests.common.tensorboard_events import read_scalars
from tests.common.transcripts import run_in_process
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EPOCHS, STEPS_PER_EPOCH = 4, 96 // 16  # the recipe: 128 samples, 3/4 for training, batches of 16


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The project in a folder of its own, importable as `my_project` (as `python -m` makes it from its folder)."""
    folder = tmp_path_factory.mktemp("users") / "project"
    shutil.copytree(REPO / "tests" / "user_project", folder)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in [name for name in sys.modules if name == "my_project" or name.startswith("my_project.")]:
        del sys.modules[name]


def config(project, run_dir, *overrides):
    return compose_config([f"hydra.searchpath=[file://{project / 'conf'}]", "recipe=linear_regression",
                           "logger.progress=off", f"run_dir={run_dir}", *overrides])


def trainkit(*args, cwd):
    environment = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=300)


def test_regression_with_a_wrapper_subclass_its_scalar_and_a_callback(graph_mode, project, tmp_path):
    epochs_file = tmp_path / "epochs.txt"
    result = train(config(project, tmp_path / "run", f"callbacks.0.path={epochs_file}"))
    run_dir = tmp_path / "run"

    # The wrapper subclass got its own argument from the recipe (wrapper/noisy.yaml sets 0.01, the recipe 0.001).
    assert type(result.wrapper).__name__ == "NoisyWrapper" and result.wrapper.noise_std == 0.001
    # Its scalar, recorded at each record: one noised window per step (no accumulation), so the count is the step.
    records = read_jsonl(run_dir / "metrics.jsonl")
    train_records = [r for r in records if "train/loss" in r]
    assert train_records and all(r["train/noisy_updates"] == r["step"] for r in train_records)
    scalars = read_scalars(run_dir / "tensorboard")
    assert [(step, value) for step, value in scalars["train/noisy_updates"]] == [
        (r["step"], r["train/noisy_updates"]) for r in train_records]

    # MSE loss and MAE/MSE metrics, as NumPy computes them from the trained network on the evaluation rows.
    x, y = result.data.eval_arrays
    result.network.set_train(False)
    prediction = result.network(ms.Tensor(x)).asnumpy().astype(np.float64)
    error = prediction - y
    assert result.metrics["mae"] == pytest.approx(np.abs(error).mean(), rel=1e-4)
    assert result.metrics["mse"] == pytest.approx((error ** 2).mean(), rel=1e-4)
    # loss: the mean of per-batch means, equal to the MSE over all rows as the batches are equal (16 rows each)
    assert result.metrics["loss"] == pytest.approx((error ** 2).mean(), rel=1e-4)
    assert "accuracy" not in result.metrics

    # best.ckpt follows the smallest MAE.
    maes = [(r["eval/mae"], r["epoch"]) for r in records if "eval/mae" in r]
    assert len(maes) == EPOCHS
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert (best["metric"], best["mode"]) == ("eval/mae", "min")
    assert (best["value"], best["epoch"]) == pytest.approx(min(maes))

    # The user's callback ran after trainkit's, at every epoch end, as the writer.
    assert epochs_file.read_text().splitlines() == [f"epoch {e} rank 0 writer True" for e in range(1, EPOCHS + 1)]


def test_the_project_runs_through_python_m_trainkit_with_keys_of_its_own_on_the_command_line(project):
    run_dir = project / "runs" / "cli"
    # Keys the project's classes take, on the command line without `+`: noise_std is in its wrapper option,
    # `every` (the callback's) in no config file at all.
    result = trainkit("hydra.searchpath=[file://conf]", "recipe=linear_regression", "wrapper.noise_std=0.002",
                      "callbacks.0.every=2", "logger=quiet", f"hydra.run.dir={run_dir}", cwd=project)
    assert result.returncode == 0, result.stderr
    saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert saved["wrapper"]["noise_std"] == 0.002 and saved["callbacks"][0]["every"] == 2
    assert (project / "epochs.txt").read_text().splitlines() == ["epoch 2 rank 0 writer True",
                                                                 "epoch 4 rank 0 writer True"]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r for r in records if "train/loss" in r][-1]["train/noisy_updates"] == EPOCHS * STEPS_PER_EPOCH
    assert json.loads((run_dir / "checkpoints" / "best.json").read_text())["metric"] == "eval/mae"


def test_evaluation_switched_off(graph_mode, project, tmp_path):
    result = train(config(project, tmp_path, "trainer.epochs=2", "callbacks=[]", "trainer.evaluate=false"))
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "train/loss" in r]  # it trained and recorded
    assert not [key for r in records for key in r if key.startswith("eval")]
    assert not (tmp_path / "checkpoints" / "best.ckpt").exists()
    assert {"loss", "mae", "mse"}.isdisjoint(result.metrics) and result.metrics["optimizer_steps"] == 2 * 6


@pytest.mark.parametrize("overrides, message", [
    (["+trainer.epoch=3"], "unknown key trainer.epoch: did you mean trainer.epochs?"),
    (["+foo=1"], "unknown key foo: the top level takes model, data, loss, metrics"),
    (["+logger.every=3"], "unknown key logger.every: logger takes tensorboard"),
    (["wrapper.noise_stdd=0.1"],
     "unknown key wrapper.noise_stdd: my_project.steps.NoisyWrapper takes no argument 'noise_stdd'; "
     "did you mean wrapper.noise_std?"),
    (["optimizer.betaz=0.9"], "unknown key optimizer.betaz: mindspore.nn.Adam takes no argument 'betaz'; "
                              "did you mean optimizer.beta"),
    (["+optimizer.betaz=0.9"], "unknown key optimizer.betaz"),
    (["loss.reduce=sum"], "unknown key loss.reduce: mindspore.nn.MSELoss takes no argument 'reduce'; "
                          "did you mean loss.reduction?"),
    (["model.hidden_size=[8]"], "did you mean model.hidden_sizes?"),
    (["model.freez=[body.*]"], "did you mean model.freeze?"),  # a key trainkit reads itself, not the model's
    (["callbacks.0.evry=2"], "unknown key callbacks[0].evry: my_project.hooks.EpochLog takes no argument 'evry'; "
                             "did you mean callbacks[0].every?"),
    (["metrics.mae.foo=1"], "unknown key metrics.mae.foo: mindspore.train.MAE takes no argument 'foo'"),
    (["optimizer.learning_rate=0.1"], "optimizer.learning_rate cannot be set: trainkit passes learning_rate"),
    (["model.dropout=high"], "model.dropout='high' is not valid: trainkit.models.mlp.MLP takes a number"),
    (["optimizer.eps=-1"], "optimizer (mindspore.nn.Adam): For 'Adam', the 'eps' must be float and must > 0"),
    (["trainer.best_metric=maee"], "trainer.best_metric='maee' is not valid: use one of mae, mse, loss (the loss and "
                                   "the names in metrics); did you mean mae?"),
    (["trainer.best_metric=mea"], "did you mean mae or mse?"),  # tied: both offered, not the last one alone
])
def test_unknown_keys_and_bad_values_stop_before_anything_is_built_naming_key_and_fix(overrides, message, project,
                                                                                       tmp_path):
    with pytest.raises(ConfigError) as error:
        train(config(project, tmp_path, *overrides))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / ".hydra").exists() and not (tmp_path / "metrics.jsonl").exists()


def test_a_float_label_with_cross_entropy_stops_before_compiling(project, tmp_path, monkeypatch):
    # `python -m trainkit ... --cfg job` earlier in this process leaves Hydra's process-global config set: its
    # choices (loss=l1) must not name the options in the in-process run's message.
    monkeypatch.chdir(tmp_path)
    assert run_in_process(["python", "-m", "trainkit", "recipe=wine_mlp", "loss=l1", "--cfg", "job"]).status == 0
    monkeypatch.setattr(ms.train.Model, "train", lambda *args, **kwargs: pytest.fail("Model.train was reached"))
    with pytest.raises(ConfigError) as error:
        train(config(project, tmp_path, "loss=cross_entropy"))
    assert str(error.value) == (
        "loss (trainkit.parts.losses.CrossEntropy) takes integer class labels, but the data's label 'y' is float32 "
        "(2, 1): for regression targets use loss=mse (or l1, smooth_l1), for 0/1 targets loss=bce_with_logits, or "
        "give int32 class labels")


@pytest.mark.parametrize("overrides, message", [
    # An MLP on images (the digits give no in_features to check against): running it once shows it.
    (["recipe=digits_quickstart", "model=mlp", "model.in_features=64", "model.out_features=10"],
     "model (trainkit.models.mlp.MLP) cannot take the data's input 'image' float32 (2, 1, 8, 8): "),
    # An element-wise loss on class logits: (2, 3) against (2,) would broadcast.
    (["loss=l1"], "loss (mindspore.nn.L1Loss) compares output and label element by element, but the model's output "
                  "is float32 (2, 3) and the label 'target' int32 (2,): "),
    (["metrics=regression"], "metrics.mae (mindspore.train.metrics.error.MAE) cannot take the model's output "
                             "float32 (2, 3) with the label int32 (2,): "),
])
def test_the_fit_check_runs_the_model_the_loss_and_the_metrics_once(overrides, message, graph_mode, tmp_path):
    with pytest.raises(ConfigError) as error:
        train(compose_config(["recipe=wine_mlp", *overrides, f"run_dir={tmp_path}"]))  # a later recipe= wins
    assert str(error.value).startswith(message)


def test_bad_input_on_the_command_line_is_one_line_and_exit_status_2(project):
    for args, message in [
        (["+trainer.epoch=3"], "trainkit: error: unknown key trainer.epoch: did you mean trainer.epochs?"),
        (["loss=cross_entropy"],
         "trainkit: error: loss=cross_entropy (trainkit.parts.losses.CrossEntropy) takes integer class labels, but the "
         "data's label 'y' is float32 (2, 1)"),
    ]:
        result = trainkit("hydra.searchpath=[file://conf]", "recipe=linear_regression", "hydra.run.dir=runs/bad",
                          *args, cwd=project)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not (project / "runs" / "bad" / ".hydra").exists()
