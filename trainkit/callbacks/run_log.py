"""RunLog: one place that records a run's scalars, to TensorBoard and to a JSON-lines file."""
from __future__ import annotations

import itertools
import json
import numbers
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from trainkit.errors import naming_the_file


def _import_tensorboardx_without_torch() -> None:
    """Import tensorboardX without PyTorch unless the process has imported PyTorch already.

    tensorboardX's package imports ``torch`` when it is installed, only to name ``torch.Tensor`` in type hints:
    2.2 s of the quick start's 10 s wall time, and a larger heap for the ``gc.collect()`` that precedes every
    MindSpore graph compile (docs/performance.md, "A command's start and end"). trainkit writes numbers only.
    """
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        import tensorboardX  # noqa: F401
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


_import_tensorboardx_without_torch()
from tensorboardX import summary as tb_summary  # noqa: E402
from tensorboardX.event_file_writer import EventsWriter  # noqa: E402
from tensorboardX.proto.event_pb2 import Event, SessionLog  # noqa: E402
from tensorboardX.proto.summary_pb2 import Summary  # noqa: E402

PathLike = Union[str, Path]


RECORD_FIELDS = ("step", "optimizer_step", "epoch", "time")  # every record's own keys; the rest are values


class RunLog:
    """Writes every record twice: TensorBoard for looking, ``metrics.jsonl`` for programs.

    Callbacks and the app record through this one object so the two outputs never disagree.

    * TensorBoard: an event file in ``<run_dir>/tensorboard/`` (a new one per RunLog), written synchronously
      with tensorboardX's protos and flushed after every call. (``tensorboardX.SummaryWriter`` queues events
      to a background thread whose ``flush()`` does not wait for the queue, so a crash or a reader could
      miss the last records.)
    * JSON lines: ``<run_dir>/<metrics_file>``, one object per ``scalars`` call,
      ``{"step": int, "optimizer_step": int, "epoch": int | null, "time": float (Unix seconds), "<tag>": value,
      ...}`` (``step`` counts micro-batches, ``optimizer_step`` the accumulation windows completed by then:
      ``step // accumulation_steps``), opened
      for appending (a resumed run adds to the file, never truncates it) and flushed after each line,
      so a crash loses nothing already recorded. Non-finite values are written as Python's ``json``
      writes them (``NaN``, ``Infinity``), which ``json.loads`` reads back.

    A run continued from a checkpoint at step S passes ``continues_at=S``: the records after S, which the
    continuation writes again, first leave the main record (see :func:`supersede_records`), and the new event
    file starts with TensorBoard's purge marker, so each step has one record in both outputs.

    Args:
        run_dir: the run's directory (created if missing).
        tensorboard: write TensorBoard event files.
        metrics_file: file name of the JSON-lines file inside `run_dir`, or None for none.
        continues_at: the step of the checkpoint this run continues from; None for a new run.
        accumulation_steps: micro-batches per optimizer step (``wrapper.accumulation_steps``).

    Usable as a context manager; ``close()`` is idempotent.
    """

    def __init__(self, run_dir: PathLike, tensorboard: bool = True, metrics_file: Optional[str] = "metrics.jsonl",
                 continues_at: Optional[int] = None, accumulation_steps: int = 1):
        self.run_dir = Path(run_dir)
        self.accumulation_steps = int(accumulation_steps)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.superseded: Optional[Path] = None
        if continues_at is not None and metrics_file is not None:
            self.superseded = supersede_records(self.run_dir / metrics_file, continues_at)
        self.tensorboard_dir: Optional[Path] = None
        self._writer = None
        if tensorboard:
            self.tensorboard_dir = self.run_dir / "tensorboard"
            self._writer = EventFile(self.tensorboard_dir)
            if continues_at is not None:
                self._writer.purge_after(continues_at)
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
        record: Dict[str, Any] = {"step": int(step), "optimizer_step": int(step) // self.accumulation_steps,
                                  "epoch": None if epoch is None else int(epoch), "time": time.time()}
        for tag, value in values.items():
            if tag in RECORD_FIELDS:
                raise ValueError(f"RunLog.scalars: tag {tag!r} is reserved for the record's own fields")
            record[tag] = _to_number(value, tag)
        if self._writer is not None:
            tags = [tag for tag in record if tag not in RECORD_FIELDS]
            # One Event for the record's values (as TensorFlow's merged summaries): tensorboardX's protobuf runs in
            # pure Python here, ~0.3 ms an Event, and a record of six values was six Events. Its Summary values are
            # made directly, as ``tb_summary.scalar`` makes them (the same bytes), without one Summary a value
            # merged after: 55 us a value inside a training loop.
            self._writer.write([scalars_summary({tag: record[tag] for tag in tags})], int(step), record["time"])
        if self._metrics is not None:
            with naming_the_file(self.metrics_path):
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
        try:
            if self._writer is not None:
                self._writer.close()
        finally:  # the metrics file is closed even when the event file's last flush fails
            if self._metrics is not None:
                with naming_the_file(self.metrics_path):
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
    ``write`` is on disk (flushed, not fsynced) when it returns. The name is unique per process and instance.

    ``EventsWriter.flush`` also fsyncs: ~5 ms a record on this machine's disk, 12 % of the quick start's steps at
    one record every 10 (bench row 4). A flush to the OS is what a crashed process or a live reader needs, as for
    ``metrics.jsonl``; ``close`` still flushes and fsyncs once."""

    _count = itertools.count()

    def __init__(self, directory: PathLike):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(directory / "events"), filename_suffix=f".{os.getpid()}.{next(self._count)}")
        self.path = Path(self._writer._file_name)
        self._closed = False
        with naming_the_file(self.path):
            self._writer.flush()

    def write(self, summaries, step: int, wall_time: float) -> None:
        """One Event per Summary proto, at `step`; then flush."""
        with naming_the_file(self.path):
            for summary in summaries:
                self._writer.write_event(Event(wall_time=wall_time, step=int(step), summary=summary))
        self._flush()

    def purge_after(self, step: int) -> None:
        """Hide every event of this folder's earlier files at a step after `step` from TensorBoard.

        Writes what ``tensorboardX.SummaryWriter(purge_step=step + 1)`` writes: a ``SessionLog.START`` event at
        ``step + 1``. TensorBoard, reading the folder's files in order, drops the events it has read so far at
        steps >= that one (the records up to `step` stay, as in ``metrics.jsonl``).
        """
        with naming_the_file(self.path):
            self._writer.write_event(Event(step=int(step) + 1, wall_time=time.time(),
                                           session_log=SessionLog(status=SessionLog.START)))
        self._flush()

    def _flush(self) -> None:
        """Flush the file to the OS without fsync (tensorboardX's ``RecordWriter`` holds the open file)."""
        stream = getattr(getattr(self._writer, "_py_recordio_writer", None), "_writer", None)
        with naming_the_file(self.path):
            if stream is None or not hasattr(stream, "flush"):  # another tensorboardX layout: its own flush
                self._writer.flush()
                return
            stream.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with naming_the_file(self.path):
                self._writer.close()


def scalars_summary(values: Mapping[str, float]) -> Summary:
    """One Summary of scalars (tag -> number), each value as ``tensorboardX.summary.scalar`` writes it."""
    return Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()])


def merged(summaries: Sequence[Summary]) -> Summary:
    """Deprecated in 0.1.0, removed in 0.3.0 (RunLog no longer uses it): one Summary holding the values of
    `summaries`. Use :func:`scalars_summary` for scalars."""
    warnings.warn("trainkit.callbacks.run_log.merged is deprecated and is removed in 0.3.0; use "
                  "scalars_summary for scalars", DeprecationWarning, stacklevel=2)
    return Summary(value=[value for summary in summaries for value in summary.value])


def supersede_records(path: Path, step: int) -> Optional[Path]:
    """Keep in JSON-lines file `path` only the records at steps <= `step`; move the others beside it.

    For a run continued from a checkpoint at `step`: the records after it were written by the run that went on
    past the checkpoint (then crashed, was stopped, or is being continued differently) and will be written again.
    They go, in their order, to ``<stem>.superseded-<n>.jsonl`` (the first free n), and `path` is replaced
    atomically (a temporary file renamed over it) by the records it keeps, so a crash leaves one or the other.
    A line that does not parse (the last line of a killed run may be cut short) counts as superseded.

    Returns:
        The superseded file, or None when nothing was after `step` (nothing is written then).
    """
    path = Path(path)
    if not path.is_file():
        return None
    kept, moved = [], []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.strip():
            continue
        try:
            record_step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            record_step = None
        (kept if isinstance(record_step, int) and record_step <= step else moved).append(
            line if line.endswith("\n") else line + "\n")
    if not moved:
        return None
    number = 1
    while path.with_name(f"{path.stem}.superseded-{number}{path.suffix}").exists():
        number += 1
    superseded = path.with_name(f"{path.stem}.superseded-{number}{path.suffix}")
    _write_durably(superseded, "".join(moved))
    temporary = path.with_name(path.name + ".tmp")
    _write_durably(temporary, "".join(kept))
    os.replace(temporary, path)
    return superseded


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())


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

