"""The developer pages name test files and tests that move (a file split, a wing made): each one they name exists.

Pure logic (no process, no MindSpore): the unit tier.
"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DEVELOPER_PAGES = [REPO / "DEVELOPERS.md", *sorted((REPO / "docs").rglob("*.md"))]
#: Test files the docs name that live in a project `python -m trainkit.new` writes, not in this repository.
GENERATED_TESTS = {"test_train.py"}


def named_test_paths(text):
    """``tests/...`` paths a page names: files, folders, ``file.py::test_name`` and ``module.Name``."""
    found = re.findall(r"(?<![\w./-])tests/[\w/.:*-]*", text)
    return [match if match.endswith("...") or not match.endswith(tuple(".,:;")) else match[:-1] for match in found]


def test_every_test_path_the_developer_pages_name_exists():
    """DEVELOPERS.md and docs/ name test files and tests that move (a file split, a wing made): each one named --
    ``tests/...`` as a file, a folder, ``file.py::test`` or ``module.Name``, and a bare ``test_*.py`` -- exists."""
    missing = []
    for page in DEVELOPER_PAGES:
        text = page.read_text(encoding="utf-8")
        for named in named_test_paths(text):
            path, _, test = named.partition("::")
            module, dot, attribute = path.rpartition(".")
            if dot and not attribute.startswith("py") and "/" not in attribute:  # tests/common/start_up.Name
                path, test = f"{module}.py", attribute
            if not (any(REPO.glob(path)) if "*" in path else (REPO / path).exists()):
                missing.append(f"{page.name}: {named}")
            elif test.strip(".") and not re.search(  # `test_name_...`: a test whose name begins so
                    rf"^\s*(def|class) {re.escape(test[:-3])}" if test.endswith("...") else
                    rf"^\s*(def|class) {re.escape(test)}\b|^{re.escape(test)} =", (REPO / path).read_text(
                        encoding="utf-8"), re.M):
                missing.append(f"{page.name}: {named} (no {test} in {path})")
        for bare in set(re.findall(r"(?<![\w/.-])(test_\w+\.py)", text)) - GENERATED_TESTS:
            if not any((REPO / "tests").rglob(bare)):
                missing.append(f"{page.name}: {bare}")
    assert not missing, "\n".join(missing)


def test_named_test_paths_reads_each_form():
    text = ("see tests/app/test_resume.py, tests/step/ and tests/test_signals.py::test_a_stop. Also "
            "`tests/common/start_up.CompilesUntilSignalledInExport`; tests/a.py::test_b_... "
            "tests/app/test_resume*.py, not mytests/x.py")
    assert named_test_paths(text) == ["tests/app/test_resume.py", "tests/step/", "tests/test_signals.py::test_a_stop",
                                      "tests/common/start_up.CompilesUntilSignalledInExport",
                                      "tests/a.py::test_b_...", "tests/app/test_resume*.py"]
