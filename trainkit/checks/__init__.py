"""Checks of what comes from outside before trainkit acts on it: a config's arguments, and the Python it writes.

``arguments`` (a value in range, a bool, a name with "did you mean", a package name that can be imported: the checks
the classes configs build share, so that a bad value stops in one line before MindSpore compiles) and
``generated_code`` (the gate every Python file trainkit writes passes: ``python -m trainkit.port`` and
``trainkit.new``). Both are here rather than in a wing that uses them because every wing does: models, data, step,
parts, the app, the bridge and the scaffolder.

The argument checks are this wing's exports (``from trainkit.checks import check_int``, the path they always had).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): imports ``trainkit.errors``
only, never ``trainkit.process``; every other wing may import it.
"""
from trainkit.checks.arguments import (
    check_bool,
    check_int,
    check_number,
    check_split_fractions,
    choice,
    did_you_mean,
    package_name_problem,
)

__all__ = ["check_bool", "check_int", "check_number", "check_split_fractions", "choice", "did_you_mean",
           "package_name_problem"]
