"""RunLog: one place that records a run's scalars, to TensorBoard and to a JSON-lines file."""
from __future__ import annotations

import itertools
import json
import numbers
import os
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

import numpy as np
from tensorboardX import summary as tb_summary
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event

PathLike = Union[str, Path]


class RunLog:
    """Writes every record twice: TensorBoard for looking, ``metrics.jsonl`` for programs.

    Callbacks and the app record through this one object so the two outputs never disagree.

    * TensorBoard: an event file in ``<run_dir>/tensorboard/`` (a new one per RunLog), written synchronously
      with tensorboardX's protos and flushed after every call. (``tensorboardX.SummaryWriter`` queues events
      to a background thread whose ``flush()`` does not wait for the queue, so a crash or a reader could
      miss the last records.)
    * JSON lines: ``<run_dir>/<metrics_file>``, one object per ``scalars`` call,
      ``{"step": int, "epoch": int | null, "time": float (Unix seconds), "<tag>": value, ...}``, opened
      for appending (a resumed run adds to the file, never truncates it) and flushed after each line,
      so a crash loses nothing already recorded. Non-finite values are written as Python's ``json``
      writes them (``NaN``, ``Infinity``), which ``json.loads`` reads back.

    Args:
        run_dir: the run's directory (created if missing).
        tensorboard: write TensorBoard event files.
        metrics_file: file name of the JSON-lines file inside `run_dir`, or None for none.

    Usable as a context manager; ``close()`` is idempotent.
    """

    def __init__(self, run_dir: PathLike, tensorboard: bool = True, metrics_file: Optional[str] = "metrics.jsonl"):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tensorboard_dir: Optional[Path] = None
        self._writer = None
        if tensorboard:
            self.tensorboard_dir = self.run_dir / "tensorboard"
            self._writer = EventFile(self.tensorboard_dir)
        self.metrics_path: Optional[Path] = None
        self._metrics = None
        if metrics_file is not None:
            self.metrics_path = self.run_dir / metrics_file
            self._metrics = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in close()
        self.closed = False

    # ------------------------------------------------------------------ records
    def scalars(self, step: int, values: Mapping[str, Any], epoch: Optional[int] = None) -> Dict[str, Any]:
        """Record `values` (tag -> number) at global `step`; returns the JSON record written."""
        self._check_open()
        record: Dict[str, Any] = {"step": int(step), "epoch": None if epoch is None else int(epoch),
                                  "time": time.time()}
        for tag, value in values.items():
            if tag in ("step", "epoch", "time"):
                raise ValueError(f"RunLog.scalars: tag {tag!r} is reserved for the record's own fields")
            record[tag] = _to_number(value, tag)
        if self._writer is not None:
            tags = [tag for tag in record if tag not in ("step", "epoch", "time")]
            self._writer.write([tb_summary.scalar(tag, float(record[tag])) for tag in tags], int(step), record["time"])
        if self._metrics is not None:
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()
        return record

    def hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float], name: str = "hparams") -> None:
        """Record a run's hyper-parameters with its final metrics for TensorBoard's HPARAMS tab.

        Nested mappings are flattened to dotted keys (``{"optimizer": {"lr": 0.1}}`` -> ``optimizer.lr``);
        values that are not bool/int/float/str become their ``str``. Written as tensorboardX's ``add_hparams``
        writes them: into the subdirectory ``tensorboard/<name>`` (TensorBoard shows it as its own run) with
        `metrics` as scalars at step 0; give the metrics tags that differ from the training curves
        (e.g. ``hparam/accuracy``). Does nothing without TensorBoard.
        """
        self._check_open()
        if self._writer is None:
            return
        flat = {key: _hparam_value(value) for key, value in flatten(hparams).items()}
        numbers_only = {tag: float(_to_number(value, tag)) for tag, value in metrics.items()}
        experiment, session_start, session_end = tb_summary.hparams(flat, numbers_only)
        events = EventFile(self.tensorboard_dir / name)
        try:
            now = time.time()
            events.write([experiment, session_start, session_end], 0, now)
            events.write([tb_summary.scalar(tag, value) for tag, value in numbers_only.items()], 0, now)
        finally:
            events.close()

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Record free text (e.g. the resolved config) in TensorBoard's TEXT tab; not in the JSON-lines file."""
        self._check_open()
        if self._writer is not None:
            self._writer.write([tb_summary.text(tag, text)], int(step), time.time())

    # ------------------------------------------------------------------ life cycle
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        if self._metrics is not None:
            self._metrics.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"RunLog for {self.run_dir} is closed")


class EventFile:
    """A TensorBoard event file written synchronously with tensorboardX's ``EventsWriter`` (the writer
    ``SummaryWriter`` runs on a background thread, whose ``flush()`` does not wait for queued events): each
    ``write`` is on disk (flushed, not fsynced) when it returns. The name is unique per process and instance."""

    _count = itertools.count()

    def __init__(self, directory: PathLike):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(directory / "events"), filename_suffix=f".{os.getpid()}.{next(self._count)}")
        self.path = Path(self._writer._file_name)
        self._writer.flush()
        self._closed = False

    def write(self, summaries, step: int, wall_time: float) -> None:
        """One Event per Summary proto, at `step`; then flush."""
        for summary in summaries:
            self._writer.write_event(Event(wall_time=wall_time, step=int(step), summary=summary))
        self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a.b": 1, "c": 2}`` (any Mapping nests, e.g. an OmegaConf DictConfig)."""
    flat: Dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "keys")):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _hparam_value(value: Any) -> Union[bool, int, float, str]:
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def _to_number(value: Any, tag: str) -> Union[int, float]:
    """A Python int/float from a number, a 0-d/1-element NumPy array or a MindSpore Tensor."""
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"RunLog: value of {tag!r} must be a scalar; got an array of shape {value.shape}")
        value = value.reshape(()).item()
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"RunLog: value of {tag!r} must be a number; got {type(value).__name__}: {value!r}")

