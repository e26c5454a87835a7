"""A project's own command (trainkit.project.main) and the scaffold that writes one (python -m trainkit.new)."""
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trainkit.new import main as new_project

NAME = "blobsproject"


def run(argv, cwd, env=None, timeout=600):
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scaffold") / NAME
    assert new_project([NAME, str(folder)]) == 0
    return folder


def test_the_scaffold_trains_through_its_own_command_from_any_directory(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"  # not the project's folder: its configs are found next to its package
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    done = run(["-m", NAME, "trainer.epochs=2", "logger.progress=off", f"hydra.run.dir={run_dir}"], cwd=elsewhere,
               env={"PYTHONPATH": str(project)})
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads(json.dumps(__import__("yaml").safe_load((run_dir / ".hydra" / "config.yaml").read_text())))
    assert config["model"]["_target_"] == f"{NAME}.model.MLP" and config["data"]["_target_"] == f"{NAME}.data.Blobs"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (test,) = [r for r in records if "test/accuracy" in r]
    assert test["test/accuracy"] > 0.5  # three classes: well above chance
    assert [r["epoch"] for r in records if "custom/weight_norm" in r] == [1, 2]  # the project's callback
    assert not list(elsewhere.iterdir())  # nothing written where the command ran but the run directory


def test_help_lists_the_projects_recipe_and_command(project):
    done = run(["-m", NAME, "--help"], cwd=project)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"python -m {NAME} [recipe=NAME]" in done.stdout
    (recipes,) = [line for line in done.stdout.splitlines() if line.startswith("recipe: ")]
    assert NAME in recipes and "digits_quickstart" in recipes  # the project's beside trainkit's
    assert f"== Config: as recipe={NAME} sets it ==" in done.stdout  # the project's recipe is the default


def test_bad_input_to_a_project_command_is_trainkits_one_line(project, tmp_path):
    done = run(["-m", NAME, "trainer.epoks=1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=project)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        done.stderr.strip()] and "did you mean trainer.epochs?" in done.stderr


def test_the_scaffolds_own_test_passes(project):
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_scaffold_refuses_a_folder_in_use_and_names_that_are_not_packages(project, tmp_path, capsys):
    before = sorted(str(p.relative_to(project)) for p in project.rglob("*"))
    assert new_project([NAME, str(project)]) == 2
    assert "is a folder that is not empty: nothing was written" in capsys.readouterr().err
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == before
    for bad, suggestion in (("9lives", "my_9lives"), ("class", "my_class"), ("my-project", "my_project"),
                            ("trainkit", "my_trainkit")):
        assert new_project([bad, str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"(e.g. {suggestion})" in err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("bad, reason, suggestion", [
    ("π", "is not an ASCII Python identifier", "project"),
    ("ünïcode", "is not an ASCII Python identifier", "n_code"),
    ("os", "is a module of Python's standard library: python -m os would run that one", "my_os"),
    ("json", "is a module of Python's standard library", "my_json"),
    ("numpy", "is an installed module (", "my_numpy"),
    ("hydra", "is an installed module (", "my_hydra"),
])
def test_the_scaffold_refuses_a_name_hydra_cannot_lex_or_that_an_importable_module_has(bad, reason, suggestion,
                                                                                         tmp_path, capsys):
    """Mutations caught: `isidentifier()` alone (accepts π, which Hydra's lexer rejects in model=π_mlp), and no
    look-up of the name on the import path (numpy was written, and python -m numpy then ran NumPy's)."""
    importable = bad.isascii() and importlib.util.find_spec(bad) is not None  # independently: Python finds it
    assert importable == (bad not in ("π", "ünïcode"))
    assert new_project([bad, str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"trainkit: error: {bad!r} cannot be the project's package name: it "
                                                   f"{reason}") and f"(e.g. {suggestion})" in err
    assert not (tmp_path / "x").exists()


def test_a_name_only_the_target_folder_or_the_current_one_holds_is_not_a_clash(tmp_path, monkeypatch, capsys):
    """A module of the name in the current folder is not on the path where the project runs (cd fresh_blobs &&
    python -m fresh_blobs), and an empty folder (the target) is no package: neither is a clash. Mutation caught:
    the current folder searched too (the module there refused the name)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fresh_blobs.py").write_text("")
    (tmp_path / "fresh_blobs").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert new_project(["fresh_blobs"]) == 0, capsys.readouterr().err
    assert (tmp_path / "fresh_blobs" / "fresh_blobs" / "__main__.py").is_file()


def test_a_project_main_without_its_config_folder_says_where_it_looked(tmp_path):
    package = tmp_path / "lost"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("from trainkit.project import main\nmain(config_path='configs')\n")
    done = run(["-m", "lost"], cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"trainkit: error: config_path='configs': {package / 'configs'} is not a folder "
                                   f"(trainkit.project.main looks for it next to {package}); give main() the folder "
                                   "that holds the project's recipe/, model/, data/ ...")


def test_a_project_config_that_is_not_yaml_is_one_line_naming_the_file(tmp_path):
    folder = tmp_path / "broken"
    assert new_project(["brokenproject", str(folder)]) == 0
    damaged = folder / "brokenproject" / "conf" / "data" / "brokenproject_blobs.yaml"
    damaged.write_text("_target_: brokenproject.data.Blobs\n  samples: [1200\n")
    done = run(["-m", "brokenproject", f"hydra.run.dir={tmp_path / 'run'}"], cwd=folder)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"trainkit: error: {damaged} is not valid YAML (line 2, column 10): mapping values "
                                   "are not allowed here; fix the file (Hydra reads every config as YAML)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, twin", [("model/mlp.yaml", "trainkit's model=mlp"),
                                        ("recipe/wine_mlp.yaml", "trainkit's recipe=wine_mlp"),
                                        ("config.yaml", "trainkit's primary config")])
def test_a_project_config_named_like_one_of_trainkits_is_refused(tmp_path, name, twin):
    """Hydra would read trainkit's model/mlp.yaml in place of the project's, silently: one line instead."""
    folder = tmp_path / "twins"
    assert new_project(["twinproject", str(folder)]) == 0
    shadowed = folder / "twinproject" / "conf" / name
    shadowed.parent.mkdir(parents=True, exist_ok=True)
    shadowed.write_text("# @package _global_\n" if name.startswith("recipe") else "{}\n")
    done = run(["-m", "twinproject", f"hydra.run.dir={tmp_path / 'run'}"], cwd=folder)
    assert done.returncode == 2
    renamed = Path(name).parent / ("my_" + Path(name).name)
    assert done.stderr.strip() == (f"trainkit: error: {shadowed} has the name of {twin}: Hydra would read one in "
                                   f"place of the other; rename it, e.g. {renamed}")


def test_the_projects_wheel_carries_a_ported_packages_weights_and_buffers(tmp_path):
    """A package ``python -m trainkit.port --into`` wrote holds weights.ckpt and buffers.npz beside model.py; a
    wheel of the project (not an editable install) must carry them. Mutation tried: the template's
    ``"*" = [...]`` package-data line removed (the wheel held only the .py files)."""
    assert new_project(["wheeled", str(tmp_path / "wheeled")]) == 0
    ported = tmp_path / "wheeled" / "wheeled" / "ported"
    ported.mkdir()
    for name, data in {"__init__.py": b"", "model.py": b"", "weights.ckpt": b"w", "buffers.npz": b"b"}.items():
        (ported / name).write_bytes(data)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(tmp_path / "wheeled")], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"wheeled/ported/weights.ckpt", "wheeled/ported/buffers.npz", "wheeled/conf/recipe/wheeled.yaml"} <= names
