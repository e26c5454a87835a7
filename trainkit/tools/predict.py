"""``python -m trainkit.predict RUN_DIR|CKPT INPUT... --out predictions.csv``: what a trained model says about new
inputs.

The data module reads the inputs (``predict_samples(inputs)``: image files, folders or tables, as it knows them)
and prepares each with its evaluation transforms, never the training augmentations; a data module without
``predict_samples`` takes rows of ``.npy``/``.npz``/``.csv`` tables already shaped as its network's input
(:mod:`trainkit.data.predict_inputs`). The network is built as ``evaluate`` builds it: the run's config (stored
configs name only trusted targets, ``--trust MODULE``), the checkpoint's live or EMA weights.

One CSV row an input: its path (``FILE:ROW`` for a table's row), the predicted class's name (the class index where
the run stored no names) and its softmax probability, then the next ``--top-k - 1`` classes and theirs; for a
regression, the predicted value(s). An input that cannot be read is one line on stderr, and the rest goes on
(exit status 1 then). The CSV is written to a temporary file and renamed into place: never a half file.
"""
from __future__ import annotations

import argparse
import csv
import inspect
import logging
import sys
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from trainkit.callbacks.progress import format_duration
from trainkit.data.predict_inputs import Sample, table_samples
from trainkit.errors import ConfigError, DataError
from trainkit.rundir.class_names import load_class_names  # the names a run stores (image folders, tables)
from trainkit.rundir.output_file import written_whole
from trainkit.rundir.trust import add_trust_argument
from trainkit.rundir.weights import WEIGHTS, refuse_existing
from trainkit.tools.inference import Trained, data_batch, load_trained, outputs, split_arguments

DEFAULT_TOP_K = 3


def check_output(output: Path, force: bool) -> None:
    """ConfigError for an output under a file or a folder as the output, CheckpointError for an existing one
    without `force`: before any work."""
    for parent in output.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"--out {output}: {parent} is a file, not a folder: choose an output in a folder")
    if output.is_dir():
        raise ConfigError(f"--out {output} is a folder: give the CSV file to write")
    refuse_existing(output, force)


def samples_of(trained: Trained, inputs: Sequence[str], split: str = "val") -> Iterator[Sample]:
    """``(input id, sample, error)`` for `inputs`: the data module's ``predict_samples`` (given `split` where it
    takes one), else rows of tables shaped as the network's input."""
    reader = getattr(trained.data, "predict_samples", None)
    if callable(reader):
        takes_split = "split" in inspect.signature(reader).parameters
        return iter(reader(list(inputs), split=split) if takes_split else reader(list(inputs)))
    shape = data_batch(trained.data, split, 1).shape[1:]
    return table_samples(inputs, lambda row: np.asarray(row, dtype=np.float32), shape,
                         f"an input of the network ({type(trained.data).__name__}'s {split} samples)")


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


class PredictProgress:
    """How far the prediction is: a line rewritten in place on a terminal, a log line every `every` seconds
    otherwise; the share of the input files done gives the ETA."""

    def __init__(self, inputs: Sequence[str], stream: Optional[IO[str]] = None, every: float = 10.0,
                 refresh: float = 0.1):
        self.files = {str(path): index for index, path in enumerate(expand(inputs))}
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every, self.refresh = (refresh if self.tty else every), refresh
        self.start = self.last = time.perf_counter()
        self.done = self.file = 0
        self.open = False

    def update(self, sample_id: str, count: int = 1) -> None:
        self.done += count
        path = sample_id if sample_id in self.files else sample_id.rpartition(":")[0]
        self.file = max(self.file, self.files.get(path, -1) + 1)
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            self._show(self.line(now))

    def line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        total = len(self.files)
        eta = elapsed * (total - self.file) / self.file if self.file else None
        return (f"predicting: file {self.file}/{total}  {self.done} inputs  {self.done / elapsed:.0f} inputs/s  "
                f"ETA {format_duration(eta)}")

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()

    def _show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text)
            self.open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def expand(inputs: Iterable[str]) -> List[Path]:
    """The files `inputs` name: files as they are, folders as the files under them (sorted)."""
    found: List[Path] = []
    for item in inputs:
        path = Path(item)
        found.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    return found


def predict(trained: Trained, inputs: Sequence[str], write_row: Callable[[List[Any]], None], top_k: int = 3,
            split: str = "val", batch_size: int = 64, skipped: Callable[[str], None] = print,
            progress: Optional[PredictProgress] = None, names: Optional[List[str]] = None) -> Tuple[int, int]:
    """Predict every input, calling `write_row` with each row and `skipped` with each input's error line.

    Args:
        names: the classes' names (None: those the run stored, :func:`class_names`; empty: class indices).

    Returns:
        (inputs predicted, inputs skipped).
    """
    names = class_names(trained) if names is None else (names or None)
    predicted = failed = 0
    pending: List[Tuple[str, np.ndarray]] = []

    def flush() -> None:
        nonlocal predicted
        if not pending:
            return
        values = outputs(trained.network, np.stack([sample for _, sample in pending]))
        if not predicted:
            write_row(header(top_k, trained.num_classes, int(np.prod(values.shape[1:]))))
        for (sample_id, _), row in zip(pending, prediction_rows(values, names, top_k, trained.num_classes)):
            write_row([sample_id, *row])
        predicted += len(pending)
        if progress is not None:
            progress.update(pending[-1][0], len(pending))
        pending.clear()

    for sample_id, sample, error in samples_of(trained, inputs, split):
        if error is not None or sample is None:
            failed += 1
            skipped(error or f"{sample_id}: no sample")
            continue
        if pending and (len(pending) >= batch_size or np.shape(sample) != np.shape(pending[0][1])):
            flush()
        pending.append((sample_id, np.asarray(sample)))
    flush()
    return predicted, failed


def class_names(trained: Trained) -> Optional[List[str]]:
    """The names the run stored for its classes, if any (else the rows name class indices)."""
    run_dir = trained.checkpoint.parent.parent if trained.checkpoint.parent.name == "checkpoints" else None
    for source in (run_dir, trained.checkpoint):
        if source is not None:
            names = load_class_names(source)
            if names:
                return [str(name) for name in names]
    return None


def header(top_k: int, num_classes: Optional[int], outputs_per_row: int) -> List[str]:
    if num_classes is None:
        return ["input", "prediction"] if outputs_per_row == 1 else [
            "input", *(f"prediction_{index}" for index in range(outputs_per_row))]
    columns = ["input", "prediction", "probability"]
    for rank in range(2, min(top_k, outputs_per_row) + 1):
        columns += [f"class_{rank}", f"probability_{rank}"]
    return columns


def prediction_rows(values: np.ndarray, names: Optional[List[str]], top_k: int,
                    num_classes: Optional[int]) -> Iterator[List[str]]:
    """A classification's top-k (name, probability) pairs, or a regression's value(s), for each output row."""
    values = values.reshape(len(values), -1)
    if num_classes is None:
        for row in values:
            yield [f"{value:.7g}" for value in row]
        return
    probabilities = softmax(values)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :min(top_k, values.shape[1])]
    for row, ranks in zip(probabilities, order):
        cells: List[str] = []
        for index in ranks:
            cells += [names[index] if names and index < len(names) else str(int(index)), f"{row[index]:.7g}"]
        yield cells


def write_csv(output: Path, rows: Callable[[Callable[[List[Any]], None]], Tuple[int, int]]) -> Tuple[int, int]:
    """`rows(write_row)` written to a temporary file beside `output`, renamed into place when it returns having
    written a row (its first result is not 0); else nothing is left."""
    with written_whole(output) as temporary:
        with temporary.open("w", newline="", encoding="utf-8") as handle:
            result = rows(csv.writer(handle).writerow)
        if not result[0]:
            temporary.unlink()  # no row: nothing replaces the output
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.predict RUN_DIR|CKPT INPUT... --out predictions.csv [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.predict",
        description="Predict new inputs (image files, folders, or tables of rows) with a trained network: one CSV "
                    "row an input, with the predicted class and the top-k probabilities (or a regression's value).")
    parser.add_argument("target", help="a checkpoint file, or a run directory (its best or newest checkpoint)")
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="image files, folders or tables (.csv, .npy, .npz); key=value items change the saved "
                             "config (e.g. data.image_size=64)")
    parser.add_argument("--out", type=Path, required=True, help="the CSV file to write")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K,
                        help=f"classes (with their probabilities) a row names, best first (default {DEFAULT_TOP_K})")
    parser.add_argument("--split", choices=("val", "test"), default="val",
                        help="whose data transforms prepare the inputs: the evaluation set's (val, default) or the "
                             "test set's; never the training augmentations")
    parser.add_argument("--weights-of", "--weights", choices=WEIGHTS, default="live", dest="weights",
                        help="live: the trained weights (default); ema: the EMA shadow weights")
    parser.add_argument("--checkpoint", choices=("best", "newest"), default="best",
                        help="for a run directory: best.ckpt (default) or the newest epoch checkpoint")
    parser.add_argument("--batch-size", type=int, default=64, help="inputs a network call (default 64)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_trust_argument(parser)
    args = parser.parse_intermixed_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    inputs, overrides = split_arguments(args.inputs)
    try:
        if args.top_k < 1 or args.batch_size < 1:
            raise ConfigError(f"--top-k and --batch-size must be at least 1; got {args.top_k} and {args.batch_size}")
        if not inputs:
            raise ConfigError("no INPUT: give image files, folders or tables (.csv, .npy, .npz) to predict")
        output = args.out.expanduser()
        check_output(output, args.force)
        trained = load_trained(Path(args.target).expanduser(), overrides, args.weights, args.checkpoint, args.trust,
                               work_dir=output.parent)
        names = class_names(trained)
        progress = PredictProgress(inputs)

        def skipped(line: str) -> None:
            progress.close()
            print(f"trainkit: skipped: {line}", file=sys.stderr)

        try:
            done, failed = write_csv(output, lambda write_row: predict(
                trained, inputs, write_row, args.top_k, args.split, args.batch_size, skipped, progress, names or []))
        finally:
            progress.close()
        if not done:
            raise DataError(f"no input could be predicted ({failed} skipped): nothing was written to {output}")
    except (ConfigError, DataError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    kind = ("regression values" if trained.num_classes is None else "classes by name" if names
            else "classes as indices: the run stored no class names")
    skipped_text = f"; skipped {failed} unreadable input(s), listed above" if failed else ""
    print(f"wrote {output}: {done} predictions by {trained.checkpoint} ({args.weights} weights), {kind}"
          f"{skipped_text}")
    return 1 if failed else 0
