"""pyproject.toml's extras and the docs that tell a user to install them: every ``trainkit[EXTRA]`` the docs name is
an extra pyproject.toml defines, and TensorBoard's viewer, which the docs point to, is one of them."""
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the check is the same on any version

REPO = Path(__file__).resolve().parents[1]


def extras():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_the_docs_name_exists():
    """Mutation caught: an extra renamed or removed while a page still says to install it."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {name for page in pages for group in re.findall(r"trainkit\[([\w,-]+)\]", page.read_text())
             for name in group.split(",")}
    assert {"tensorboard", "onnx", "torch"} <= named
    assert named <= set(extras()), named - set(extras())


def test_the_tensorboard_extra_installs_the_viewer():
    """tensorboard --logdir outputs needs the tensorboard distribution; trainkit itself writes with tensorboardX."""
    requirements = extras()["tensorboard"]
    assert [re.match(r"[\w.-]+", item).group(0) for item in requirements] == ["tensorboard"]
