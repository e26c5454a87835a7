"""A project of your own with its own command: ``python -m myproject recipe=mine``, everything ``python -m
trainkit`` does, with the project's config folder beside trainkit's (docs/your-project.md).

``command`` holds :func:`main`, exported here: a project's ``__main__.py`` calls ``trainkit.project.main(config_path=
"conf")`` (``trainkit.cli.main``, its path before 0.2, works with a warning until 0.3.0). It runs trainkit's command
(``trainkit.__main__``) with the project's folder, so it sits above every wing, beside ``trainkit.new`` (the
scaffolder that writes such a project) rather than in the process plumbing the command uses.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): the top layer, with
``trainkit.new`` (neither imports the other): may import every wing and ``trainkit.__main__``; nothing of trainkit
imports it.
"""
from trainkit.project.command import main

__all__ = ["main"]
