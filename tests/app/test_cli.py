"""`python -m trainkit` as users run it: help, --cfg job, a run directory, sweeps, exit status on bad input."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.common.cifar10_files import write_cifar10

REPO = Path(__file__).resolve().parents[2]
TINY = ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", "data.image_size=8", "data.batch_size=8",
        "data.num_parallel_workers=1", "trainer.epochs=1", "data.val_fraction=0.2"]


def trainkit(*args, cwd, env=None):
    environment = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def cifar10_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar10")
    write_cifar10(str(root), train_per_file=10, test_records=8)
    return root


def test_help_lists_groups_and_recipes(tmp_path):
    result = trainkit("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("recipe: diabetes_regression, digits_lstm, digits_optuna, digits_quickstart, resnet50_cifar10, "
            "text_classification, wine_mlp") in result.stdout
    assert "amp: O0, O1, O2, O3" in result.stdout
    assert "model: mlp, resnet101, resnet152, resnet18, resnet34, resnet50, row_lstm, small_cnn, text_bag" in \
        result.stdout
    assert "loss: bce_with_logits, cross_entropy, l1, mse, smooth_l1" in result.stdout


def test_help_labels_its_config_block_with_the_recipe_it_comes_from(tmp_path):
    for recipe in ("digits_quickstart", "wine_mlp"):
        result = trainkit(f"recipe={recipe}", "--help", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"== Config: as recipe={recipe} sets it ==" in result.stdout
        assert "These are the recipe's values, not the groups' defaults" in result.stdout


def test_cfg_job_prints_the_composed_config_with_overrides(tmp_path):
    result = trainkit("recipe=resnet50_cifar10", "trainer.epochs=3", "amp=O2", "wrapper.ema_decay=0.9999",
                      "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["trainer"]["epochs"] == 3 and cfg["amp"]["level"] == "O2" and cfg["wrapper"]["ema_decay"] == 0.9999
    assert cfg["model"]["_target_"] == "trainkit.models.resnet.resnet50" and cfg["data"]["image_size"] == 224
    assert not (tmp_path / "outputs").exists()  # printing the config runs nothing


def test_a_run_writes_config_log_metrics_events_and_checkpoints_into_its_own_directory(cifar10_root, tmp_path):
    result = trainkit(*TINY, f"data.root={cifar10_root}", "amp=O1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "outputs" / "resnet50_cifar10").iterdir()
    saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert saved["model"]["width"] == 4 and saved["data"]["root"] == str(cifar10_root)
    log = (run_dir / "train.log").read_text()
    assert "finished: accuracy" in log and ", amp O1, run dir" in log and "amp_level 1" in log  # the level that ran
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/accuracy" in r for r in records) and any("train/loss" in r for r in records)
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tensorboard").iterdir())
    assert (run_dir / "checkpoints" / "best.ckpt").exists()
    assert not (tmp_path / "rewritten_network").exists()  # O1's rewrite writes there: kept in the run directory
    assert any((run_dir / "rewritten_network").iterdir())


def test_multirun_sweeps_into_one_directory_per_job(cifar10_root, tmp_path):
    result = trainkit("-m", *TINY, f"data.root={cifar10_root}", "trainer.seed=0,1", "logger=quiet",
                      "trainer.save_checkpoints=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (sweep,) = (tmp_path / "multirun" / "resnet50_cifar10").iterdir()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1"]
    seeds = [yaml.safe_load((sweep / job / ".hydra" / "config.yaml").read_text())["trainer"]["seed"] for job in jobs]
    assert seeds == [0, 1]
    assert all((sweep / job / "metrics.jsonl").exists() for job in jobs)


@pytest.mark.parametrize("args, message", [
    (["wrapper.accumulation_steps=0"], "wrapper.accumulation_steps=0 is not valid: it must be an integer >= 1"),
    (["trainer.device_target=GPU"], "trainer.device_target=GPU is not available to this MindSpore build"),
    (["recipe=resnet50_cifar10", "data.root=missing_folder"], "missing_folder/cifar-10-batches-bin does not exist"),
    # A value its type refuses: one line and 2, not Hydra's six lines and 1 (mutation tried: _mistyped_override
    # returning None: red, status 1)
    (["-m", "trainer.epochs=1,abc"], "trainer.epochs=1,abc: trainer.epochs takes an integer, not 'abc'"),
])
def test_bad_input_exits_with_status_2_and_one_clear_message(args, message, tmp_path):
    result = trainkit(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert "trainkit: error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_configs_and_recipes_ship_in_the_wheel(tmp_path):
    """A plain (non-editable) install carries configs/ and recipes/ as package data, and the console script."""
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    # No skip: the test extra installs setuptools (a Python 3.12 venv has none), so a missing backend is a failure.
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("trainkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("trainkit/configs/config.yaml", "trainkit/configs/amp/O3.yaml", "trainkit/configs/model/resnet50.yaml",
                 "trainkit/recipes/resnet50_cifar10.yaml", "trainkit/recipes/digits_quickstart.yaml",
                 "trainkit/configs/hydra/launcher/trainkit.yaml",  # -m sweeps: trainkit's launcher, in the namespace
                 "hydra_plugins/trainkit_launcher/__init__.py"):  # package where Hydra looks for one
        assert name in names, name
    assert "hydra_plugins/__init__.py" not in names  # a namespace shared with the other Hydra plugins
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "trainkit = trainkit.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    target = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(target)  # what pip install puts in site-packages
    result = subprocess.run([sys.executable, "-c", "import trainkit, sys; print(trainkit.__file__)"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True,
                            text=True)
    assert result.stdout.strip().startswith(str(target))
    result = trainkit("recipe=resnet50_cifar10", "--cfg", "job", cwd=tmp_path, env={"PYTHONPATH": str(target)})
    assert result.returncode == 0 and "resnet50" in result.stdout, result.stderr


def test_bad_input_aimed_at_an_existing_run_changes_nothing_there(cifar10_root, tmp_path):
    run_dir = tmp_path / "run"
    assert trainkit(*TINY, f"data.root={cifar10_root}", f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for bad in (["wrapper.accumulation_steps=0"], ["data.root=missing_folder"], ["trainer.epochs=2"],  # valid
                ["trainer.resume=auto", "data.augment=false"],  # a resume on other samples
                ["trainer.resume=auto"]):  # a finished run: nothing left
        result = trainkit(*TINY, f"data.root={cifar10_root}", *bad, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("trainkit: error:") == 1 and "Traceback" not in result.stderr
        assert "data.augment" not in bad[-1] or "needs the same data.augment" in result.stderr
    # byte for byte, train.log included: the resume's lines and the error are not appended to it
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
