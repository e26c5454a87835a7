"""A project's own command: ``python -m myproject recipe=mine``, with everything ``python -m trainkit`` does.

A project calls :func:`main` from its ``__main__.py``::

    from trainkit.project import main

    main(config_path="conf", config_name="myproject")

The config folder is found next to that file, whatever the current directory, and joins trainkit's (Hydra's
``--config-dir``): the project's recipes and groups sit beside trainkit's, ``--help`` lists both, and
``config_name`` names the project's primary config (one that starts from trainkit's, ``defaults: [config,
override recipe: mine, _self_]``), so that the bare command runs the project's recipe. Checks before compiling,
one-line errors, ``-m`` sweeps and their summary, data parallel through msrun (the workers get the same config
folder), and the command a stopped run prints to continue it all work as in ``python -m trainkit``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence


def main(config_path: str = "conf", config_name: Optional[str] = None, argv: Optional[Sequence[str]] = None,
         program: Optional[str] = None) -> None:
    """Run trainkit's command line with the calling project's config folder.

    Args:
        config_path: the project's config folder, relative to the file that calls this (or absolute).
        config_name: the project's primary config in that folder (``NAME.yaml``); None keeps trainkit's, and the
            project's recipes are chosen with ``recipe=NAME``.
        argv: the command's arguments (default ``sys.argv[1:]``).
        program: the command's name in messages and ``--help`` (default: the calling package, as ``python -m``
            runs it).
    """
    caller = sys._getframe(1).f_globals
    # A project's python -m (the module python -m runs has a __spec__), not a script, a notebook or a test
    command_process = caller.get("__name__") == "__main__" and caller.get("__spec__") is not None
    base = Path(caller.get("__file__") or ".").resolve().parent
    folder = Path(config_path).expanduser()
    folder = (folder if folder.is_absolute() else base / folder).resolve()
    program = program or caller.get("__package__") or Path(sys.argv[0]).stem
    if not folder.is_dir():
        _refuse(f"config_path={config_path!r}: {folder} is not a folder (trainkit.project.main looks for it next to "
                f"{base}); give main() the folder that holds the project's recipe/, model/, data/ ...")
    if config_name is not None and not (folder / f"{config_name}.yaml").is_file():
        _refuse(f"config_name={config_name!r}: {folder / (config_name + '.yaml')} does not exist; name a .yaml file "
                f"of {folder} (without .yaml), or leave config_name out to start from trainkit's config")
    problem = _unreadable_yaml(folder) or _hidden_by_trainkit(folder)
    if problem:
        _refuse(problem)
    flags = [f"--config-dir={folder}", *([f"--config-name={config_name}"] if config_name else [])]
    overrides = [f"hydra.help.app_name={program}"]  # after the user's: Hydra's parser takes flags first
    from trainkit.process import signals, startup_gc
    from trainkit.rundir import command

    signals.start()  # before trainkit.__main__'s imports: a signal during them waits for their end
    if command_process:
        startup_gc.pause()  # as python -m trainkit: no full collection through the imports (process/startup_gc.py)
    previous_argv = sys.argv
    command.set_entry_point(["python", "-m", program], [*flags, *overrides])
    sys.argv = [sys.argv[0], *flags, *(sys.argv[1:] if argv is None else argv), *overrides]
    try:
        from trainkit.__main__ import main as trainkit_main

        trainkit_main()
    finally:  # a process that goes on (tests, a notebook) is trainkit's again
        command.set_entry_point(["python", "-m", "trainkit"])
        sys.argv = previous_argv
        signals.finish()
        startup_gc.resume()


def _unreadable_yaml(folder: Path) -> Optional[str]:
    """The first config file of the project that is not YAML, said in one line (Hydra would print a traceback)."""
    import yaml

    for path in sorted(folder.rglob("*.yaml")):
        try:
            yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            return f"{path} cannot be read: {error}"
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            return f"{path} is not valid YAML{where}: {problem}; fix the file (Hydra reads every config as YAML)"
    return None


def _hidden_by_trainkit(folder: Path) -> Optional[str]:
    """A project config named like one of trainkit's: Hydra would silently read trainkit's instead (a group's
    option) or fail in its own words (a recipe, which trainkit keeps in Hydra's ConfigStore)."""
    from importlib import resources

    shipped = resources.files("trainkit.configs")
    recipes = resources.files("trainkit.recipes")
    for path in sorted(folder.rglob("*.yaml")):
        relative = path.relative_to(folder)
        if relative.parts[0] == "recipe" and len(relative.parts) == 2:
            twin = recipes / relative.name
        else:
            twin = shipped.joinpath(*relative.parts)
        if twin.is_file():
            what = ("trainkit's primary config" if relative == Path("config.yaml")
                    else f"trainkit's {relative.parent.as_posix()}={relative.stem}")
            return (f"{path} has the name of {what}: Hydra would read one in place of the other; rename it, "
                    f"e.g. {relative.parent / ('my_' + relative.name)}")
    return None


def _refuse(message: str) -> None:
    print(f"trainkit: error: {message}", file=sys.stderr)
    sys.exit(2)
