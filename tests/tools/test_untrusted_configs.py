"""A checkpoint or a run directory is data, never code: a stored config names only trusted ``_target_``s.

The planted configs below call ``pathlib.Path.write_text`` (not on Hydra's block list) to write a file: that the
file does not exist afterwards is what shows nothing ran. Mutation tried: ``check_trusted`` returning at once in
``saved_config`` (the planted file is written, exit 0).
"""
import json
import shutil

import mindspore as ms
import pytest
import yaml
from omegaconf import OmegaConf

from tests.bridge.test_convert import user_project
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.app.tool_config import tool_config
from trainkit.errors import ConfigError
from trainkit.rundir.checkpoint_file import checkpoint_files
from trainkit.tools.evaluate import main as evaluate

USER = "tests.common.user_project"


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    """One epoch of a user's project (its model and data are tests.common.user_project's)."""
    folder = tmp_path_factory.mktemp("user")
    run_dir = folder / "run"
    train(compose_config([*user_project(folder), f"run_dir={run_dir}", "trainer.epochs=1", "logger.progress=off"]))
    return run_dir


def planted(target_file):
    """What the issue planted: ``Path(target_file).write_text(...)`` through two nested targets."""
    return {"_target_": "pathlib.Path.write_text",
            "_args_": [{"_target_": "pathlib.Path", "_args_": [str(target_file)]}, "import os; os.system('true')"]}


def with_config(source, destination, change):
    """A copy of training checkpoint `source` whose stored config `change(config)` edits."""
    saved = ms.load_checkpoint(str(source))
    config = yaml.safe_load(saved.pop("trainkit_config"))
    change(config)
    parameters = [{"name": name, "data": value} for name, value in saved.items() if not isinstance(value, str)]
    # with a valid CRC32: whoever plants a config can checksum the file; the CRC32 detects damage, not attacks
    ms.save_checkpoint(parameters, str(destination), append_dict={"trainkit_config": yaml.safe_dump(config)},
                       crc_check=True)
    return destination


def one_error_line(capsys):
    err = capsys.readouterr().err
    assert err.startswith("trainkit: error: ") and err.count("\n") == 1, err
    return err


def test_a_users_checkpoint_evaluates_only_when_its_package_is_trusted(user_run, tmp_path, capsys):
    checkpoint = checkpoint_files(user_run / "checkpoints")[-1]
    output = tmp_path / "eval.json"
    assert evaluate([str(checkpoint), "--output", str(output)]) == 2
    err = one_error_line(capsys)
    assert f"{USER}." in err and f"--trust {USER}" in err and not output.exists()

    assert evaluate([str(checkpoint), "--output", str(output), "--trust", USER]) == 0
    result = json.loads(output.read_text())
    assert result["samples"] == 96 and sum(map(sum, result["confusion_matrix"])) == 96


@pytest.mark.parametrize("where", ["data", "nested"])
def test_a_planted_checkpoint_writes_nothing_and_exits_2(user_run, tmp_path, capsys, where):
    victim = tmp_path / "site-packages" / "x.pth"
    victim.parent.mkdir()

    def plant(config):
        if where == "data":
            config["data"] = planted(victim)
        else:  # a trusted target whose argument is the planted call
            config["data"]["batch_size"] = planted(victim)

    checkpoint = with_config(checkpoint_files(user_run / "checkpoints")[-1], tmp_path / "planted.ckpt", plant)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert evaluate([str(checkpoint), "--trust", USER]) == 2
    err = one_error_line(capsys)
    assert "pathlib.Path" in err and "not trusted" in err and "--trust pathlib" in err
    assert not victim.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_planted_run_directory_is_refused_by_evaluate_and_the_tools(user_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(user_run, run_dir)
    victim = tmp_path / "x.pth"
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    config.model = OmegaConf.create({"_target_": f"{USER}.UserMLP", "hidden": 16,
                                     "num_classes": OmegaConf.create(planted(victim))})
    OmegaConf.save(config, run_dir / ".hydra" / "config.yaml")
    assert evaluate([str(run_dir), "--trust", USER]) == 2
    assert "model.num_classes._target_=pathlib.Path.write_text" in one_error_line(capsys)
    with pytest.raises(ConfigError, match="not trusted"):  # compare and convert read run= through tool_config
        tool_config([f"run={run_dir}"], trust=[USER])
    assert not victim.exists()
    assert not list(run_dir.glob("**/*.eval.json"))


# Issue 30, round two. An *escaped* interpolation is a plain string to the trust walk, and resolving the config
# unescapes it into a live one, which instantiate then calls. Mutation tried: check_plain_data returning at once
# (the victim file is written, exit 0, through evaluate RUN_DIR and evaluate CKPT). The generator of
# tests/rundir/test_stored_config.py plants such strings everywhere; these go through a trained user's run.

def escaped_plant(victim):
    return (r"\${oc.create:{_target_: pathlib.Path.write_text, _args_: [{_target_: pathlib.Path, _args_: ['"
            + str(victim) + r"']}, 'import os']}}")


def test_an_escaped_interpolation_in_a_run_directory_runs_nothing(user_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(user_run, run_dir)
    victim = tmp_path / "x.pth"
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    config["data"]["batch_size"] = escaped_plant(victim)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    assert evaluate([str(run_dir), "--trust", USER]) == 2
    err = one_error_line(capsys)
    assert "data.batch_size holds" in err and "nothing in it is ever evaluated" in err
    with pytest.raises(ConfigError, match="data.batch_size holds"):  # convert and compare read run= so too
        tool_config([f"run={run_dir}"], trust=[USER])
    assert not victim.exists()


@pytest.mark.parametrize("key", ["data.batch_size", "lr_schedule.min_lr"])
def test_an_escaped_interpolation_in_a_checkpoints_config_runs_nothing(user_run, tmp_path, capsys, key):
    victim = tmp_path / "x.pth"

    def plant(config):
        group, leaf = key.split(".")
        config[group][leaf] = escaped_plant(victim)

    checkpoint = with_config(checkpoint_files(user_run / "checkpoints")[-1], tmp_path / "planted.ckpt", plant)
    assert evaluate([str(checkpoint), "--trust", USER]) == 2
    assert f"{key} holds" in one_error_line(capsys)
    from trainkit.rundir.checkpoint_file import read_training_checkpoint  # what trainer.resume=PATH reads first

    with pytest.raises(ConfigError, match=f"{key} holds"):
        read_training_checkpoint(checkpoint)
    assert not victim.exists()


def test_a_stored_config_never_makes_a_tool_download(user_run, tmp_path, capsys):
    """A shipped target with hostile arguments: CIFAR-10 with download=true into any folder."""
    run_dir = tmp_path / "run"
    shutil.copytree(user_run, run_dir)
    elsewhere = tmp_path / "anywhere" / "cifar"
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    config["data"] = {"_target_": "trainkit.data.cifar10.Cifar10Data", "root": str(elsewhere), "download": True,
                      "url": "http://127.0.0.1:9/never.tar.gz"}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    assert tool_config([f"run={run_dir}"], trust=[USER]).data.download is False
    assert tool_config([f"run={run_dir}", "data.download=true"], trust=[USER]).data.download is True  # the user's
    assert evaluate([str(run_dir), "--trust", USER]) == 2
    one_error_line(capsys)
    assert not (tmp_path / "anywhere").exists()
