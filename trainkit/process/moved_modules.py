"""The module paths trainkit had before 0.2, kept importable until 0.3.0 with a ``DeprecationWarning``.

``import trainkit`` installs :class:`MovedModules` first in ``sys.meta_path``: an old path (``import
trainkit.losses``, ``from trainkit.bridge import port_code``, a config's ``_target_: trainkit.lr_schedule.cosine``)
is answered with the module at its new path -- the same module object, so classes, functions and their state are
one, whichever name imported them -- before any other finder could find a stale copy under the old name (an
editable install of an older checkout, a file an upgrade left behind). Nothing is imported until an old path is
asked for; any other import costs one dictionary lookup here.

Runs stored before the move name the old paths in their configs. :func:`current_name` gives the new path of a
dotted name, so that a resume compares a stored ``_target_`` with this run's by what it names, not how;
:func:`former_names` gives the old paths of a name, so that a stored config naming trainkit's own target by its old
path is still trainkit's own (``trainkit.rundir.trust``).
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at run time: the package imports this module before any command's
if TYPE_CHECKING:
    from typing import Dict, List

REMOVED_IN = "0.3.0"

#: old module path -> new module path (docs/public-api.md lists each one)
MOVED: Dict[str, str] = {
    "trainkit.signals": "trainkit.process.signals",
    "trainkit.startup_gc": "trainkit.process.startup_gc",
    "trainkit.protobuf_backend": "trainkit.process.protobuf_backend",
    "trainkit.tool_command": "trainkit.process.tool_command",
    "trainkit.losses": "trainkit.parts.losses",
    "trainkit.metrics": "trainkit.parts.metrics",
    "trainkit.lr_schedule": "trainkit.parts.lr_schedule",
    "trainkit.generated_code": "trainkit.checks.generated_code",
    "trainkit.cli": "trainkit.project.command",
    **{f"trainkit.bridge.port_{name}": f"trainkit.bridge.port.{name}" for name in (
        "arguments", "buffers", "classes", "code", "depth", "layers", "names", "nested", "operators", "source",
        "tables", "ties", "trace", "transformers", "windows")},
    **{f"trainkit.app.sweep_{name}": f"trainkit.app.sweep.{name}" for name in (
        "launcher", "plot", "records", "summary")},
}


def current_name(dotted: str) -> str:
    """`dotted` (a module, or a name in one) under its module's current path: ``trainkit.losses.CrossEntropy`` ->
    ``trainkit.parts.losses.CrossEntropy``; any other name unchanged."""
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        new = MOVED.get(".".join(parts[:end]))
        if new is not None:
            return ".".join([new, *parts[end:]])
    return dotted


def former_names(dotted: str) -> List[str]:
    """The paths `dotted` had before its module moved (``trainkit.parts.losses.CrossEntropy`` ->
    ``["trainkit.losses.CrossEntropy"]``); [] for a name whose module never moved."""
    return [".".join([old, dotted[len(new) + 1:]]) if dotted != new else old
            for old, new in MOVED.items() if dotted == new or dotted.startswith(new + ".")]


class MovedModules:
    """A ``sys.meta_path`` finder and loader: an old module path imports the module at its new path, with a
    DeprecationWarning naming both and the release that removes the old one."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in MOVED:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, self)

    def create_module(self, spec: object) -> None:
        return None  # a plain module, replaced in sys.modules by exec_module

    def exec_module(self, module: object) -> None:
        import importlib
        import warnings

        old = module.__name__
        warnings.warn(f"{old} is now {MOVED[old]}; the old path is removed in {REMOVED_IN}", DeprecationWarning,
                      stacklevel=2)
        # The import system returns what sys.modules holds under the old name once this returns: the new module
        sys.modules[old] = importlib.import_module(MOVED[old])


def install() -> None:
    """Put the finder first in ``sys.meta_path``, once."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
