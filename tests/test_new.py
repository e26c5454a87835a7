"""python -m trainkit.new refuses, in one line and writing nothing, a name that cannot make a project that runs,
and a project whose generated modules fail the gate of trainkit.checks.generated_code."""
import ast
import keyword
import sys

import pytest

from trainkit.errors import ConfigError
from trainkit.new import main as new_project
from trainkit.project import scaffold


@pytest.mark.parametrize("bad, reason", [
    ("__main__", "is a name Python gives a meaning of its own"),
    ("__init__", "is a name Python gives a meaning of its own"),
    ("__pycache__", "is a name Python gives a meaning of its own"),
    ("sitecustomize", "is a name Python gives a meaning of its own"),
    ("usercustomize", "is a name Python gives a meaning of its own"),
    ("lambda", "is a Python keyword"),
    ("match", None),  # a soft keyword: a fine module name
    ("my.project", "is not an ASCII Python identifier"),
    ("a b", "is not an ASCII Python identifier"),
    ("x\ny", "is not an ASCII Python identifier"),
    ("trainkit", "is taken"),
    ("mindspore", "is taken"),
    ("ast", "is a module of Python's standard library"),
])
def test_a_name_that_cannot_make_a_project_that_runs_is_refused_in_one_line(bad, reason, tmp_path, capsys):
    """Mutation caught: without the dunder and site-hook names, __main__ and sitecustomize made projects
    (python -m __main__ runs no project; a sitecustomize package runs in every interpreter on its path)."""
    assert keyword.iskeyword(bad) == (bad == "lambda") and (bad in sys.stdlib_module_names) == (bad == "ast")
    code = new_project([bad, str(tmp_path / "x")])
    err = capsys.readouterr().err
    if reason is None:
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 1 and f"cannot be the project's package name: it {reason}" in err
    assert not (tmp_path / "x").exists()


def test_every_module_the_project_writes_passes_the_gate_and_a_template_that_does_not_writes_nothing(
        tmp_path, monkeypatch):
    """Mutation caught: without check_generated in write_project, the template with a call at module level
    was written."""
    written = scaffold.write_project("gated_blobs", tmp_path / "ok")
    for path in written:
        if path.suffix == ".py":
            tree = ast.parse(path.read_text())
            assert all(isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.Assign,
                                         ast.Expr, ast.If)) for node in tree.body), path
    hostile = {**scaffold._FILES, "{name}/extra.py": "import os\nos.system('touch {name}_marker')\n"}
    monkeypatch.setattr(scaffold, "_FILES", hostile)
    with pytest.raises(ConfigError) as raised:
        scaffold.write_project("gated_blobs", tmp_path / "bad")
    assert "\n" not in str(raised.value) and "refused to write gated_blobs/extra.py" in str(raised.value)
    assert not (tmp_path / "bad").exists()
