import sys

import pytest


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """tmp_path as the current folder and on the import path (as `python -m` puts it); the packages written there
    forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
