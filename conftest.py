"""Settings for the examples in README.md and docs/, which pytest-markdown-docs runs as tests (`--markdown-docs`).

Each Python block runs on its own, as a script would: in a fresh temporary directory (relative paths in an
example, a run directory or an exported checkpoint, land there and never in the repository), as a module that
can be imported by name (MindSpore's graph compiler imports the module of a Cell's method to read its globals;
the plugin's own runner executes blocks in a module it does not register).
"""
import os
import sys
import types

os.environ.setdefault("GLOG_v", "3")
# python -m trainkit caches compiled graphs per config (trainkit/app/compile_cache.py): not into the user's cache
os.environ.setdefault("TRAINKIT_CACHE_DIR", __import__("tempfile").mkdtemp(prefix="trainkit-test-cache-"))

import pytest  # noqa: E402
from pytest_markdown_docs._runners import DefaultRunner, register_runner  # noqa: E402  (pinned: 0.9.2)

EXAMPLE_MODULE = "markdown_example"


@register_runner(default=True)
class ImportableExampleRunner(DefaultRunner):
    """The plugin's runner, with the block's globals registered in `sys.modules` as `markdown_example`."""

    def runtest(self, test, args, *, asyncio_runner=None):
        module = types.ModuleType(EXAMPLE_MODULE)
        module.__dict__.update({name: value for name, value in args.items() if name != "__name__"})
        sys.modules[EXAMPLE_MODULE] = module
        try:
            super().runtest(test, module.__dict__, asyncio_runner=asyncio_runner)
        finally:
            del sys.modules[EXAMPLE_MODULE]


@pytest.fixture(autouse=True)
def _markdown_example_in_a_temporary_directory(request, tmp_path, monkeypatch):
    if request.node.get_closest_marker("markdown-docs") is not None:
        monkeypatch.chdir(tmp_path)
