"""``python -m trainkit.predict RUN_DIR|CKPT INPUT... --out predictions.csv``: what a trained model says about new
inputs.

The data module reads the inputs (``predict_samples(inputs)``: image files, folders or tables, as it knows them;
sentences for ``data=text``) and prepares each with its evaluation transforms, never the training augmentations; a
data module without ``predict_samples`` takes rows of ``.npy``/``.npz``/``.csv`` tables already shaped as its
network's input (:mod:`trainkit.data.predict_inputs`). The network is built as ``evaluate`` builds it: the run's
config (stored configs name only trusted targets, ``--trust MODULE``), the checkpoint's live or EMA weights.

One CSV row an input: its path (``FILE:ROW`` for a table's row), the predicted class's name (the class index where
the run stored no names) and its softmax probability, then the next ``--top-k - 1`` classes and theirs; for a
regression, the predicted value(s). An input that cannot be read is one line on stderr, and the rest goes on
(exit status 1 then); an input holding NaN or inf stops the command, as training refuses it (``--skip-bad``: skipped
and counted). The CSV is written to a temporary file and renamed into place: never a half file; a text cell that a
spreadsheet would run as a formula gets a leading ``'``.
"""
from __future__ import annotations

import argparse
import csv
import inspect
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from trainkit.callbacks.progress import format_duration
from trainkit.data.predict_inputs import NonFiniteInput, Sample, table_samples
from trainkit.errors import ConfigError, DataError
from trainkit.rundir.class_names import load_class_names  # the names a run stores (image folders, tables)
from trainkit.rundir.output_file import spreadsheet_row, written_whole
from trainkit.rundir.trust import add_trust_argument
from trainkit.rundir.weights import WEIGHTS, refuse_existing
from trainkit.tools.inference import Trained, data_batch, eager, load_trained, outputs, split_arguments

DEFAULT_TOP_K = 3
AUTO_BATCH_VALUES = 2 ** 20  # input values a network call when --batch-size is not given (4 MiB of float32)
AUTO_BATCH_MAX = 4096
NON_FINITE_RULE = "inputs must be finite numbers, as training's are; fix it, or pass --skip-bad to skip such inputs"


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
    return table_samples(inputs, lambda rows: np.asarray(rows, dtype=np.float32), shape,
                         f"an input of the network ({type(trained.data).__name__}'s {split} samples)", batched=True)


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
        path = Path(item)  # os.path.isdir: a sentence (a text run's input) longer than a file name is no folder
        found.extend(sorted(p for p in path.rglob("*") if p.is_file()) if os.path.isdir(item) else [path])
    return found


@dataclass
class PredictCounts:
    """What :func:`predict` did with the inputs."""

    predicted: int = 0
    unreadable: int = 0  # inputs that could not be read: one line each
    non_finite: int = 0  # rows holding NaN or inf, skipped under skip_bad (else the first one stops the run)


def predict(trained: Trained, inputs: Sequence[str], write_row: Callable[[List[Any]], None], top_k: int = 3,
            split: str = "val", batch_size: Optional[int] = None, skipped: Callable[[str], None] = print,
            progress: Optional[PredictProgress] = None, names: Optional[List[str]] = None,
            skip_bad: bool = False) -> PredictCounts:
    """Predict every input, `batch_size` a network call, calling `write_row` with each row and `skipped` with each
    unreadable input's error line.

    The first batch runs eagerly (:func:`~trainkit.tools.inference.eager`: a graph-mode network compiles only when
    a second batch comes), and every later call takes a whole batch: a shorter one (the last, or one that skip_bad
    left short) is padded with copies of its last input (their outputs dropped), so the graph compiles once, not
    once per batch size (a compile costs about as much as predicting every digit). In evaluation mode an input's
    output does not depend on its batch-mates, so the rows equal those of one input at a time.

    Args:
        batch_size: inputs a network call (None: :func:`auto_batch_size` of the first input).
        names: the classes' names (None: those the run stored, :func:`class_names`; empty: class indices).
        skip_bad: skip the inputs holding NaN or inf (counted); otherwise the first one raises DataError.

    Raises:
        DataError: an input holds NaN or inf and `skip_bad` is off (training refuses them too).
    """
    names = class_names(trained) if names is None else (names or None)
    num_classes = trained.num_classes
    counts = PredictCounts()
    ids: List[str] = []
    samples: List[np.ndarray] = []
    called: List[bool] = []  # the network ran: later batches are padded to `limit`, the graph's one shape
    limit = batch_size or 0

    def flush() -> None:
        if not samples:
            return
        batch = np.stack(samples)
        kept = _finite_rows(batch, ids, inputs, skip_bad)
        if kept is not None:
            counts.non_finite += len(batch) - len(kept)
            batch, kept_ids = batch[kept], [ids[index] for index in kept]
        else:
            kept_ids = list(ids)
        ids.clear()
        samples.clear()
        if not len(batch):
            return
        if not called:  # the first batch eagerly: a single batch compiles nothing
            called.append(True)
            with eager():
                values = outputs(trained.network, batch)
        else:
            padding = limit - len(batch)
            fed = np.concatenate([batch, np.repeat(batch[-1:], padding, axis=0)]) if padding > 0 else batch
            values = outputs(trained.network, fed)[:len(batch)]
        if not counts.predicted:
            write_row(header(top_k, num_classes, int(np.prod(values.shape[1:]))))
        for sample_id, row in zip(kept_ids, prediction_rows(values, names, top_k, num_classes)):
            write_row((sample_id, *row))
        counts.predicted += len(batch)
        if progress is not None:
            progress.update(kept_ids[-1], len(batch))

    for sample_id, sample, error in samples_of(trained, inputs, split):
        if isinstance(error, NonFiniteInput):  # a table's row, never prepared (a uint8 cast would hide the NaN)
            if not skip_bad:
                raise DataError(f"{error}: {NON_FINITE_RULE}")
            counts.non_finite += 1
            continue
        if error is not None or sample is None:
            counts.unreadable += 1
            skipped(error or f"{sample_id}: no sample")
            continue
        sample = np.asarray(sample)
        if not limit:
            limit = auto_batch_size(sample)
        if samples and (len(samples) >= limit or sample.shape != samples[0].shape):
            flush()
        ids.append(sample_id)
        samples.append(sample)
    flush()
    return counts


def auto_batch_size(sample: np.ndarray) -> int:
    """Inputs a network call when none is asked for: as many as hold :data:`AUTO_BATCH_VALUES` values, at most
    :data:`AUTO_BATCH_MAX` (4096 digits of 8 x 8, 341 CIFAR-10 images, 6 images of 224 x 224 x 3): a call's fixed
    cost spread over many small inputs, memory bounded for large ones."""
    return max(1, min(AUTO_BATCH_MAX, AUTO_BATCH_VALUES // max(1, int(np.size(sample)))))


def _finite_rows(batch: np.ndarray, ids: List[str], inputs: Sequence[str], skip_bad: bool) -> Optional[np.ndarray]:
    """None when every input of `batch` is finite; else the indices of those that are (`skip_bad`), or DataError
    naming the first input holding NaN or inf."""
    if not np.issubdtype(batch.dtype, np.inexact):
        return None
    finite = np.isfinite(batch.reshape(len(batch), -1)).all(axis=1)
    if finite.all():
        return None
    if skip_bad:
        return np.flatnonzero(finite)
    first = int(np.argmin(finite))
    values = batch[first].reshape(-1)
    raise DataError(f"{input_name(ids[first], inputs)} holds {values[~np.isfinite(values)][0]}: {NON_FINITE_RULE}")


def input_name(sample_id: str, inputs: Sequence[str]) -> str:
    """``FILE, row N`` for a table's row (``FILE:N``, or ``N`` alone where there is one input), else the id."""
    path, _, row = sample_id.rpartition(":")
    if path and row.isdigit():
        return f"{path}, row {row}"
    if sample_id.isdigit() and len(inputs) == 1:
        return f"{inputs[0]}, row {sample_id}"
    return sample_id


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
                    num_classes: Optional[int]) -> List[Tuple[str, ...]]:
    """A classification's top-k (name, probability) pairs, or a regression's value(s), for each output row: built
    a column at a time (a list of names, a list of formatted numbers), then zipped into rows."""
    values = values.reshape(len(values), -1)
    if num_classes is None:
        columns = [[f"{value:.7g}" for value in column] for column in values.T.tolist()]
        return list(zip(*columns))
    probabilities = softmax(values)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :min(top_k, values.shape[1])]
    chances = np.take_along_axis(probabilities, order, axis=1)
    labels = [names[index] if names and index < len(names) else str(index) for index in range(values.shape[1])]
    columns = []
    for ranks, column in zip(order.T.tolist(), chances.T.tolist()):
        columns += [[labels[index] for index in ranks], [f"{chance:.7g}" for chance in column]]
    return list(zip(*columns))


def write_csv(output: Path, rows: Callable[[Callable[[List[Any]], None]], PredictCounts]) -> PredictCounts:
    """`rows(write_row)` written to a temporary file beside `output`, renamed into place when it returns having
    predicted an input; else nothing is left. Each row is written as :func:`spreadsheet_row` makes it, so no
    class or file name becomes a spreadsheet formula."""
    with written_whole(output) as temporary:
        with temporary.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            result = rows(lambda row: writer.writerow(spreadsheet_row(row)))
        if not result.predicted:
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
                        help="image files, folders or tables (.csv, .npy, .npz); for a data=text run, sentences, "
                             ".txt files (a text a line) or tables of texts; key=value items change the saved "
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
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"inputs a network call (default: as many as hold {AUTO_BATCH_VALUES} values, at most "
                             f"{AUTO_BATCH_MAX})")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip inputs holding NaN or inf, and count them (default: the first one stops the run, "
                             "as training refuses them)")
    add_trust_argument(parser)
    args = parser.parse_intermixed_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    inputs, overrides = split_arguments(args.inputs)
    try:
        if args.top_k < 1 or (args.batch_size is not None and args.batch_size < 1):
            raise ConfigError(f"--top-k and --batch-size must be at least 1; got {args.top_k} and {args.batch_size}")
        if not inputs:
            raise ConfigError("no INPUT: give image files, folders or tables (.csv, .npy, .npz) to predict (a text "
                              "run: sentences, .txt files or tables of texts)")
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
            counts = write_csv(output, lambda write_row: predict(
                trained, inputs, write_row, args.top_k, args.split, args.batch_size, skipped, progress, names or [],
                args.skip_bad))
        finally:
            progress.close()
        if not counts.predicted:
            raise DataError(f"no input could be predicted ({counts.unreadable + counts.non_finite} skipped): nothing "
                            f"was written to {output}")
    except (ConfigError, DataError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    kind = ("regression values" if trained.num_classes is None else "classes by name" if names
            else "classes as indices: the run stored no class names")
    skipped_text = (f"; skipped {counts.unreadable} unreadable input(s), listed above" if counts.unreadable else "") + (
        f"; skipped {counts.non_finite} input(s) holding NaN or inf (--skip-bad)" if counts.non_finite else "")
    print(f"wrote {output}: {counts.predicted} predictions by {trained.checkpoint} ({args.weights} weights), {kind}"
          f"{skipped_text}")
    return 1 if counts.unreadable else 0
