"""trainkit.bridge.torch_import: torchvision (and timm) import in a process that imported torch through trainkit,
and torchvision's schemas are defined only where its own operators did not load."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import trainkit.bridge.torch_import as torch_import

ROOT = Path(__file__).resolve().parents[2]


class FakeOps:
    """``torch.ops``: ``torchvision.nms`` exists once `registered` holds it; load_library registers it or fails."""

    def __init__(self, registered: set, loads: bool):
        self.registered, self.loads, self.loaded = registered, loads, []

    @property
    def torchvision(self):
        if "nms" not in self.registered:
            return SimpleNamespace()  # AttributeError on .nms, as torch.ops says for a missing operator
        return SimpleNamespace(nms=object())

    def load_library(self, path):
        self.loaded.append(path)
        if not self.loads:
            raise OSError(f"Could not load this library: {path}")
        self.registered.add("nms")


def fake_torch(registered=(), loads=False):
    defined = []

    class Library:
        def __init__(self, namespace, kind):
            assert (namespace, kind) == ("torchvision", "DEF")

        def define(self, schema):
            if schema.split("(")[0] in ops.registered:  # torch refuses a second schema of one operator
                raise RuntimeError(f"torchvision::{schema} already has a schema")
            ops.registered.add(schema.split("(")[0])
            defined.append(schema)

    ops = FakeOps(set(registered), loads)
    return SimpleNamespace(ops=ops, library=SimpleNamespace(Library=Library)), defined


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that defined nothing yet, whose torchvision is a folder with a ``_C`` library (or none)."""
    monkeypatch.setattr(torch_import, "_library", None)
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "_C.so").write_bytes(b"")
    spec = SimpleNamespace(submodule_search_locations=[str(package)])
    monkeypatch.setattr(torch_import.importlib.util, "find_spec",
                        lambda name: spec if name == "torchvision" else None)
    return package


def test_schemas_are_defined_where_torchvisions_operators_do_not_load(fresh):
    """Mutation caught: the definition skipped (timm's import stops on torchvision::nms); a schema left out."""
    torch, defined = fake_torch(loads=False)
    torch_import._define_torchvision_schemas(torch)
    assert torch.ops.loaded == [str(fresh / "_C.so")]  # torchvision's own library tried first
    assert [schema.split("(")[0] for schema in defined] == ["nms", "qnms"]
    assert torch_import.torchvision_schemas_defined()
    torch_import._define_torchvision_schemas(torch)  # once per process: a second call defines nothing
    assert len(defined) == 2


@pytest.mark.parametrize("registered, loads", [((), True), (("nms",), False)], ids=["loads", "there-already"])
def test_nothing_is_defined_where_torchvisions_operators_load(fresh, registered, loads):
    """A torchvision built for this torch registers its schemas when its library loads: a second definition would
    make its own registration fail. Mutation caught: the schemas defined without looking."""
    torch, defined = fake_torch(registered, loads)
    torch_import._define_torchvision_schemas(torch)
    assert defined == [] and not torch_import.torchvision_schemas_defined()


def test_nothing_is_defined_without_torchvision(monkeypatch):
    monkeypatch.setattr(torch_import, "_library", None)
    monkeypatch.setattr(torch_import.importlib.util, "find_spec", lambda name: None)
    torch, defined = fake_torch()
    torch_import._define_torchvision_schemas(torch)
    assert defined == [] and torch.ops.loaded == []


@pytest.mark.slow  # 10-20 s (torch, timm and MindSpore imported, a port); the tests above cover the logic, and
# tests/bridge/test_port_zoo.py ports timm models through import_torch in the default suite
def test_the_documented_timm_port_runs_as_written(tmp_path):
    """docs/coming-from-pytorch.md's command, in a process of its own (torchvision may be imported already in this
    one), with nothing done by the user first: where the installed torchvision's C++ operators do not load against
    this torch, it exited 2 on ``operator torchvision::nms does not exist``.

    Mutation caught: port importing torch without import_torch (exit 2, the nms error)."""
    pytest.importorskip("torch")
    if torch_import.importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    command = [sys.executable, "-m", "trainkit.port", "timm:create_model", "--arg", "model_name=mobilenetv3_small_050",
               "--arg", "num_classes=6", "--out", "mnv3", "--input-shape", "3,64,64"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "agree:" in done.stdout and (tmp_path / "mnv3" / "weights.ckpt").is_file()


@pytest.mark.slow  # about 40 s (three processes importing torch, transformers and MindSpore); the page's transcript
# runs the same commands in one process in the default suite (tests/test_docs_transcripts.py)
def test_the_documented_transformers_port_runs_as_written_in_fresh_processes(tmp_path):
    """docs/coming-from-pytorch.md's text_models.py, ported, exported back and checked by check_bert.py, each a
    process of its own as a user runs them: `import transformers` then a model class stops on torchvision::nms
    beside the package index's torchvision unless import_torch ran first (port does; check_bert.py does).

    Mutation caught: check_bert.py without its import_torch() (exit 1, ModuleNotFoundError for the class)."""
    pytest.importorskip("torch")
    if torch_import.importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    from tests.common.transcripts import page_files

    files = page_files(ROOT / "docs" / "coming-from-pytorch.md")
    for name in ("text_models.py", "check_bert.py"):
        (tmp_path / name).write_text(files[name], encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "GLOG_v": "3"}
    for command in (["trainkit.port", "text_models:bert", "--out", "ported_bert", "--input-shape", "16",
                     "--input-ints", "1000"],
                    ["trainkit.export", "ported_bert/weights.ckpt", "bert_back.pt", "--to", "torch"],
                    ["check_bert"]):
        done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, env=environment,
                              cwd=tmp_path, timeout=600)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    assert "the same class on both sides: True" in done.stdout
