"""The class names a run trained on, kept where predictions and exports find them.

A data module may say what its classes are called: ``class_names: Optional[List[str]]`` (index i names class i;
None or absent: the classes have no names, or the task is a regression). The app writes them to
``<run_dir>/class_names.json`` and appends them to every checkpoint it writes (training checkpoints and
``best.ckpt``, under :data:`CHECKPOINT_KEY`), so a checkpoint copied away from its run still names its classes.
``trainkit.predict``, ``trainkit.evaluate`` and ``trainkit.export`` read them back with :func:`load_class_names`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from trainkit.errors import CheckpointError, DataError
from trainkit.rundir.checkpoint_file import load_checkpoint_file
from trainkit.rundir.output_file import write_text_whole

FILE_NAME = "class_names.json"
CHECKPOINT_KEY = "trainkit_class_names"  # a checkpoint's append_dict entry: the names as a JSON list


def class_names_of(data: Any) -> Optional[List[str]]:
    """A data module's ``class_names`` (checked: a list of distinct strings), or None when it has none."""
    names = getattr(data, "class_names", None)
    if names is None:
        return None
    names = list(names)
    if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
        raise DataError(f"{type(data).__name__}.class_names must be distinct strings; got {names!r}")
    return names


def checkpoint_entries(names: Optional[Sequence[str]]) -> Dict[str, str]:
    """What a checkpoint's ``append_dict`` gets for `names` (nothing when None)."""
    return {} if names is None else {CHECKPOINT_KEY: json.dumps(list(names))}


def save_class_names(run_dir: Union[str, Path], names: Sequence[str]) -> Path:
    """Write `names` to ``<run_dir>/class_names.json`` atomically (a temporary file renamed into place)."""
    return write_text_whole(Path(run_dir) / FILE_NAME, json.dumps(list(names), indent=1, ensure_ascii=False) + "\n")


def load_class_names(run_dir_or_checkpoint: Union[str, Path]) -> Optional[List[str]]:
    """The class names of a run directory or of a checkpoint; None when the run's data had none.

    A checkpoint's own entry comes first; a checkpoint written without one (an older run) falls back to the
    ``class_names.json`` of the run it sits in (``<run_dir>/checkpoints/<file>.ckpt``).

    Raises:
        CheckpointError: the checkpoint is missing or corrupt (the message names it).
        DataError: ``class_names.json`` is not a JSON list of strings (the message names it).
    """
    path = Path(run_dir_or_checkpoint)
    if path.is_dir():
        return _read_file(path / FILE_NAME)
    entry = load_checkpoint_file(path).get(CHECKPOINT_KEY)
    if entry is not None:
        return _parse(entry if isinstance(entry, str) else str(entry), f"checkpoint {path}")
    if path.parent.name == "checkpoints":
        return _read_file(path.parent.parent / FILE_NAME)
    return None


def _read_file(path: Path) -> Optional[List[str]]:
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path} cannot be read: {error}") from error
    return _parse(text, str(path))


def _parse(text: str, where: str) -> List[str]:
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        error = CheckpointError if where.startswith("checkpoint") else DataError
        raise error(f"{where}: the class names are not a JSON list of strings")
    return names
