"""A project of your own: its command and the scaffold that writes one (docs/your-project.md).

``command`` holds :func:`main`, exported here: a project's ``__main__.py`` calls ``trainkit.project.main(config_path=
"conf")`` and gets ``python -m myproject recipe=mine`` with everything ``python -m trainkit`` does, the project's
config folder beside trainkit's (``trainkit.cli.main``, its path before 0.2, works with a warning until 0.3.0).
``scaffold`` writes such a project (``python -m trainkit.new NAME``, whose entry point is a few lines around it).
They are one concern -- a project outside trainkit that uses it -- and the command runs trainkit's own
(``trainkit.__main__``), so this wing sits above every other rather than with the process plumbing the command uses.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import every wing and the
entry points (``trainkit.__main__``); only ``trainkit.new`` imports it.
"""
from trainkit.project.command import main

__all__ = ["main"]
