"""evaluate RUN_DIR of a run whose config names ${hydra:runtime.cwd}: saved resolved by the app, and an old run
directory saved unresolved reads Hydra's record of the run, else stops with one line naming the key."""
import json

import yaml

from tests.app.test_cli import TINY, trainkit
from tests.common.cifar10_files import write_cifar10
from trainkit.tools.evaluate import main as evaluate


def test_a_run_using_hydra_runtime_cwd_evaluates_from_its_run_directory(tmp_path, capsys, monkeypatch):
    write_cifar10(str(tmp_path / "cifar10"), train_per_file=10, test_records=16)
    done = trainkit(*TINY, "data.root=${hydra:runtime.cwd}/cifar10", "data.val_fraction=0.2",
                    "logger.progress=off", "hydra.run.dir=run",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = yaml.safe_load((tmp_path / "run" / ".hydra" / "config.yaml").read_text())
    assert saved["data"]["root"] == f"{tmp_path}/cifar10"  # resolved where the run ran

    monkeypatch.chdir(tmp_path / "run")  # anywhere: the path no longer depends on the cwd
    assert evaluate([str(tmp_path / "run"), "--output", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["samples"] == 10  # validation (of 50)

    # a run directory written before the config was saved resolved: Hydra's record of the run resolves it
    saved["data"]["root"] = "${hydra:runtime.cwd}/cifar10"
    saved["run_dir"] = "${hydra:runtime.output_dir}"
    (tmp_path / "run" / ".hydra" / "config.yaml").write_text(yaml.safe_dump(saved))
    assert evaluate([str(tmp_path / "run"), "--output", str(tmp_path / "old.json")]) == 0
    assert json.loads((tmp_path / "old.json").read_text())["samples"] == 10  # validation (of 50)
    (tmp_path / "old.json").unlink()

    (tmp_path / "run" / ".hydra" / "hydra.yaml").unlink()  # no record of the run's cwd: one line naming the key
    capsys.readouterr()
    assert evaluate([str(tmp_path / "run"), "--output", str(tmp_path / "old.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trainkit: error: ")
    assert "data.root holds '${hydra:runtime.cwd}/cifar10', an interpolation" in err
    assert not (tmp_path / "old.json").exists()
    assert evaluate([str(tmp_path / "run"), f"data.root={tmp_path}/cifar10", "--output",
                     str(tmp_path / "old.json")]) == 0
