"""The package's wings and their import rules (``[tool.importlinter]`` in pyproject.toml): a higher wing may import a
lower one, never the reverse; no module imports itself through others; no PyTorch needed to import any module."""
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """import-linter on the package found in ``package_parent``, with the project's contracts."""
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=package_parent, capture_output=True, text=True,
                          env={"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin"})


def test_the_wings_import_rules_hold():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout


@pytest.mark.parametrize("module, crossing", [
    ("step/wrapper.py", "from trainkit.app import build as _crossing  # noqa"),          # step -> app
    ("callbacks/progress.py", "from trainkit.app.build import build_model as _crossing"),  # callbacks -> builders
    ("rundir/weights.py", "from trainkit.tools import export as _crossing"),               # the old circle
    ("bridge/convert.py", "from trainkit.tools import evaluate as _crossing"),             # sibling wings
    ("parts/lr_schedule.py", "from trainkit.step import ema as _crossing"),                # sibling parts
    ("checks/arguments.py", "from trainkit.process import signals as _crossing"),         # sibling foundations
])
def test_a_wall_crossed_by_hand_is_caught(tmp_path, module, crossing):
    shutil.copytree(REPO / "trainkit", tmp_path / "trainkit", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "trainkit" / module
    path.write_text(path.read_text() + f"\n{crossing}\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout


def _cycles(graph) -> list:
    """Each import circle (a module reaching itself through direct imports, lazy ones included), as a chain."""
    modules = sorted(graph.modules)
    state, stack, found = {}, [], []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(imported) == "open":
                found.append(stack[stack.index(imported):] + [imported])
            elif imported not in state:
                visit(imported)
        stack.pop()
        state[module] = "done"

    for module in modules:
        if module not in state:
            visit(module)
    return found


def test_no_import_circle():
    graph = grimp.build_graph("trainkit", cache_dir=None)
    # a package's __init__ that re-exports its own submodule is not a circle between concerns
    for package in [m for m in graph.modules if graph.find_children(m)]:
        for child in graph.find_children(package):
            if graph.direct_import_exists(importer=package, imported=child):
                graph.remove_import(importer=package, imported=child)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=importer, imported=imported)
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def test_every_module_imports_without_pytorch():
    modules = [".".join(p.relative_to(REPO).with_suffix("").parts) for p in sorted((REPO / "trainkit").rglob("*.py"))]
    modules = [m.removesuffix(".__init__") for m in modules if not m.endswith("__main__")]
    code = "import sys; sys.modules['torch'] = None\n" + "\n".join(f"import {m}" for m in modules)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            env={"GLOG_v": "3", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]


# The raw config stays in the app: below it, only the modules that read a config from a file (the run directory's
# stored config, trust, the checkpoint file and the command that made a run) and the process launchers (started
# from the command with the app's config) may import OmegaConf or Hydra. The callbacks, the step library, the
# parts and the ranks' agreement take plain values: the plan, mappings, text.
CONFIG_READERS = {"trainkit/rundir/stored_config.py", "trainkit/rundir/trust.py", "trainkit/rundir/checkpoint_file.py",
                  "trainkit/rundir/command.py", "trainkit/distributed/launch.py", "trainkit/distributed/machines.py"}
BELOW_THE_APP = ("callbacks", "distributed", "rundir", "step", "models", "data", "parts", "kernels", "checks",
                 "process")


def config_imports(path):
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    return [name for name in names if name.split(".")[0] in ("omegaconf", "hydra")]


def test_no_module_below_the_app_takes_the_raw_config_but_the_readers_of_stored_configs():
    files = [path for wing in BELOW_THE_APP for path in (REPO / "trainkit" / wing).rglob("*.py")]
    files.append(REPO / "trainkit" / "errors.py")
    found = {str(path.relative_to(REPO)): config_imports(path) for path in files}
    assert {path for path, names in found.items() if names} <= CONFIG_READERS, found


# The entrance hall: the python -m entry points and the public faces, nothing else (issue 51).
COMMANDS = {"__main__", "evaluate", "predict", "export", "convert", "compare", "port", "new"}


def test_the_top_level_holds_at_most_10_modules_every_command_among_them():
    top = sorted(path.stem for path in (REPO / "trainkit").glob("*.py"))
    assert len(top) <= 10, top
    assert set(top) >= COMMANDS, COMMANDS - set(top)
    assert set(top) - COMMANDS <= {"__init__", "errors"}, top
    for name in COMMANDS - {"__main__"}:  # thin: a few lines around the main of a module in a wing
        lines = (REPO / "trainkit" / f"{name}.py").read_text(encoding="utf-8").splitlines()
        assert len(lines) <= 40, (name, len(lines))


# Every module path that moved in 0.1.x and the path it moved to, written out here rather than read from the code:
# docs/public-api.md lists the same ones, to be removed in 0.3.0.
PORT_PARTS = ("arguments", "buffers", "classes", "code", "depth", "layers", "names", "nested", "operators", "source",
              "tables", "ties", "trace", "transformers", "windows")
OLD_PATHS = {
    **{f"trainkit.{name}": f"trainkit.process.{name}" for name in
       ("signals", "startup_gc", "protobuf_backend", "tool_command")},
    **{f"trainkit.{name}": f"trainkit.parts.{name}" for name in ("losses", "metrics", "lr_schedule")},
    "trainkit.generated_code": "trainkit.checks.generated_code",
    "trainkit.cli": "trainkit.project.command",
    **{f"trainkit.bridge.port_{name}": f"trainkit.bridge.port.{name}" for name in PORT_PARTS},
    **{f"trainkit.app.sweep_{name}": f"trainkit.app.sweep.{name}" for name in
       ("launcher", "plot", "records", "summary")},
}


def _forget(old: str) -> None:
    """As in a fresh process: the old path not imported yet (an earlier test may have)."""
    sys.modules.pop(old, None)
    parent, _, child = old.rpartition(".")
    if parent in sys.modules and child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)


@pytest.mark.parametrize("old, new", sorted(OLD_PATHS.items()))
def test_an_old_module_path_imports_the_moved_module_with_a_deprecation_warning(old, new):
    import importlib

    _forget(old)
    with pytest.warns(DeprecationWarning, match=rf"^{old} is now {new}; the old path is removed in 0\.3\.0$"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    _forget(old)
    parent, _, child = old.rpartition(".")
    with pytest.warns(DeprecationWarning, match=old):  # from PARENT import CHILD, as old code wrote it
        assert getattr(__import__(parent, fromlist=[child]), child) is module


def test_every_moved_path_is_listed_with_its_release_and_no_other_path_is_taken():
    from trainkit.process.moved_modules import MOVED

    assert MOVED == OLD_PATHS
    old_names = (REPO / "docs" / "public-api.md").read_text(encoding="utf-8").split("## Old names kept for a while")[1]
    rows = [line.rstrip() for line in old_names.splitlines() if line.startswith("| `trainkit.")]
    for old in OLD_PATHS:  # by its whole path, or by its last part in a row that names the whole path of a sibling
        wing, last = old.rsplit(".", 1)
        assert any((f"`{old}`" in row or (f"`{last}`" in row and f"`{wing}." in row)) and row.endswith("| 0.3.0 |")
                   for row in rows), old


def test_a_config_naming_an_old_path_still_builds_what_it_named():
    from hydra.utils import get_class, get_method

    from trainkit.parts.losses import CrossEntropy
    from trainkit.parts.lr_schedule import cosine

    _forget("trainkit.losses")
    _forget("trainkit.lr_schedule")
    with pytest.warns(DeprecationWarning, match="trainkit.losses is now trainkit.parts.losses"):
        assert get_class("trainkit.losses.CrossEntropy") is CrossEntropy
    with pytest.warns(DeprecationWarning, match="trainkit.lr_schedule is now trainkit.parts.lr_schedule"):
        assert get_method("trainkit.lr_schedule.cosine") is cosine
