"""What a data module learnt from the training data, kept where predictions find it.

A data module may hold state a prediction needs and the config cannot give: a table's categories, means and
standard deviations, fitted on the training split (:class:`trainkit.data.table.TableData`). It says so with
``state_dict() -> Optional[dict]`` (JSON-able) and takes it back with ``load_state_dict(state)`` (Lightning's
DataModule hooks). The app writes it to ``<run_dir>/data_state.json`` and appends it to every checkpoint it writes
(under :data:`CHECKPOINT_KEY`); :func:`load_data_state` reads either.

In the run's registry of stateful parts it is the part ``data`` (:class:`FittedData`, with the class names): every
training checkpoint holds what the module fitted, and a resume refuses, in one line, a module that fitted
something else this time (the training file was edited or replaced since the checkpoint).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from trainkit.errors import CheckpointError, DataError
from trainkit.rundir.checkpoint_file import load_checkpoint_file

FILE_NAME = "data_state.json"
CHECKPOINT_KEY = "trainkit_data_state"


def data_state_of(data: Any) -> Optional[Dict[str, Any]]:
    """A data module's ``state_dict()`` after ``prepare()``, or None when it has none."""
    method = getattr(data, "state_dict", None)
    state = method() if callable(method) else None
    if state is not None and not isinstance(state, dict):
        raise DataError(f"{type(data).__name__}.state_dict() must return a dict or None; got {type(state).__name__}")
    return state


def checkpoint_entries(state: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """What a checkpoint's ``append_dict`` gets for `state` (nothing when None)."""
    return {} if state is None else {CHECKPOINT_KEY: json.dumps(state)}


def save_data_state(run_dir: Union[str, Path], state: Dict[str, Any]) -> Path:
    """Write `state` to ``<run_dir>/data_state.json`` atomically."""
    path = Path(run_dir) / FILE_NAME
    temporary = path.with_name(FILE_NAME + ".tmp")
    temporary.write_text(json.dumps(state, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def load_data_state(run_dir_or_checkpoint: Union[str, Path]) -> Optional[Dict[str, Any]]:
    """The data state of a run directory or a checkpoint (its own entry first, else its run's file); None when
    the run's data module kept none."""
    path = Path(run_dir_or_checkpoint)
    if not path.is_dir():
        entry = load_checkpoint_file(path).get(CHECKPOINT_KEY)
        if entry is not None:
            return _parse(str(entry), f"checkpoint {path}", CheckpointError)
        if path.parent.name != "checkpoints":
            return None
        path = path.parent.parent
    file = path / FILE_NAME
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{file} cannot be read: {error}") from error
    return _parse(text, str(file), DataError)


def _parse(text: str, where: str, error: type) -> Dict[str, Any]:
    try:
        state = json.loads(text)
    except ValueError:
        state = None
    if not isinstance(state, dict):
        raise error(f"{where}: the data state is not a JSON object")
    return state


class FittedData:
    """The data module's fitted state as a stateful part (``data``): what it learnt of the training split and its
    class names, as :func:`data_state_of` and ``class_names_of`` gave them after ``prepare()``.

    A resume's module fits again from the training data; :meth:`load_state_dict` checks that it fitted the same,
    since the checkpoint's weights were trained on data normalised, encoded and labelled that way.
    """

    part_kind = "data module"

    def __init__(self, data_kind: str, state: Optional[Dict[str, Any]], class_names: Optional[List[str]]):
        self.data_kind = data_kind
        self.state = state
        self.class_names = class_names

    def state_dict(self) -> Dict[str, Any]:
        return {"state": self.state, "class_names": self.class_names}

    def load_state_dict(self, stored: Dict[str, Any]) -> None:
        """Raises ValueError naming what differs (the registry makes it one line naming the checkpoint)."""
        for key, now in self.state_dict().items():
            before = stored[key]
            if _canonical(before) != _canonical(now):
                what = "class names" if key == "class_names" else "fitted state (statistics, categories)"
                raise ValueError(f"{self.data_kind} gives other {what} than the checkpoint's run did "
                                 f"({_short(before)} there, {_short(now)} now): the training data changed since; "
                                 "resume with the data it was written with, or start a new run")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


def _short(value: Any, limit: int = 80) -> str:
    text = _canonical(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."
