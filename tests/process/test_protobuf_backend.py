"""trainkit.process.protobuf_backend: a command's process writes its protobuf messages with upb, not the pure-Python
backend importing MindSpore picks (docs/performance.md); a library import and a value in the environment are left
alone."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VARIABLE = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"

# After the code under test: import MindSpore (which sets the variable to "python" when it is unset), then report the
# backend protobuf runs on and the variable the process's children inherit.
_BACKEND = ("import mindspore\n"
            "from google.protobuf.internal import api_implementation\n"
            f"print(json.dumps([api_implementation.Type(), os.environ.get({VARIABLE!r})]))\n")


def _backend(code: str, **env: str) -> list:
    """Run `code` then _BACKEND in a fresh interpreter without the variable (unless given in `env`)."""
    environment = {k: v for k, v in os.environ.items() if k != VARIABLE}
    result = subprocess.run([sys.executable, "-c", "import contextlib, io, json, os, runpy, sys\n" + code + _BACKEND],
                            capture_output=True, text=True, timeout=120,
                            env={**environment, "GLOG_v": "3", "PYTHONPATH": str(REPO), **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def _run_module(module: str) -> str:
    """``python -m <module> --help`` as python -m runs it (runpy, the module named ``__main__``)."""
    return (f"sys.argv = [{module!r}, '--help']\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")


def test_mindspore_alone_picks_pure_python():
    """What the commands change: without them, importing MindSpore makes protobuf pure Python (if this fails, a
    MindSpore release stopped doing it, and trainkit.process.protobuf_backend has nothing left to do)."""
    assert _backend("") == ["python", "python"]


@pytest.mark.parametrize("module", ["trainkit", "trainkit.predict", "trainkit.evaluate", "trainkit.export",
                                    "trainkit.compare", "trainkit.convert", "trainkit.port"])
def test_a_command_runs_protobuf_on_upb_and_its_children_inherit_it(module):
    assert _backend(_run_module(module)) == ["upb", "upb"]


def test_a_value_in_the_environment_is_kept():
    assert _backend(_run_module("trainkit.predict"), **{VARIABLE: "python"}) == ["python", "python"]


def test_importing_trainkit_as_a_library_leaves_mindspores_choice():
    assert _backend("import trainkit, trainkit.export, trainkit.app\n") == ["python", "python"]


def test_nothing_is_chosen_once_protobuf_is_imported():
    """Its backend is fixed at its first import: a variable set later would only mislead the children."""
    assert _backend("import google.protobuf\nimport trainkit.process.protobuf_backend as b\n"
                    f"assert b.choose_upb() is False and {VARIABLE!r} not in os.environ\n") == ["python", "python"]
