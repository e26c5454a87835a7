"""The inputs ``python -m trainkit.predict`` reads for a data module: rows of a table (``.csv``, ``.npy``, ``.npz``),
and image files or folders of them.

A data module answers ``predict_samples(inputs)`` with ``(input id, sample or None, error line or None)`` per input:
the sample prepared with its evaluation transforms (never the training augmentations), or one line saying why
that input was skipped. The helpers here read the rows, so that a module only says how one row becomes a sample:

- ``.npy``: one sample per entry of the first axis;
- ``.npz``: the same, of its only array (or its ``x``, ``features`` or ``image`` array);
- ``.csv``: one sample per line of numbers (a first line that is not numbers is a header).

A row's id is ``FILE:ROW`` (rows counted from 0, the header not counted), an image's its path. Images are decoded
by ``mindspore.dataset.vision.Decode(to_pil=True)``, which raises on a truncated file; its OpenCV decoder
(``to_pil=False``) ends the process with SIGFPE on a truncated JPEG (MindSpore 2.10).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np
from mindspore.dataset import vision

from trainkit.data.image_check import opened_image
from trainkit.data.input_file import open_input, read_input
from trainkit.errors import DataError

Sample = Tuple[str, Optional[np.ndarray], Optional[str]]
TABLE_SUFFIXES = (".csv", ".npy", ".npz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
NPZ_KEYS = ("x", "features", "image")
PREPARE_ROWS = 4096  # rows a batched prepare takes at once: its arithmetic vectorised, its memory bounded


class NonFiniteInput(str):
    """The error line of a table row holding NaN or inf (``FILE, row N holds nan``): a ``str`` as every error line
    is, so a reader that only shows it still can; ``python -m trainkit.predict`` refuses it as training refuses such
    values (``--skip-bad``: skipped and counted). The row is never prepared: a cast to ``uint8`` would hide the NaN."""


def read_table(path: Path) -> np.ndarray:
    """The rows of a ``.csv``/``.npy``/``.npz`` file as an array (first axis: rows).

    Raises:
        DataError: the file is missing or not a regular file (a FIFO, a device...), naming it.
        ValueError: the file cannot be read as rows of numbers, with the reason (shown after the file's name).
    """
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"is not a table: give a {', '.join(TABLE_SUFFIXES)} file")
    with open_input(path) as stream:  # DataError (naming the file) unless a regular file
        array = _read_csv(stream) if suffix == ".csv" else _read_numpy(stream, suffix)
    if array.ndim == 0 or len(array) == 0:
        raise ValueError("holds no rows")
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"holds {array.dtype} values: it must hold numbers")
    return array


def _read_numpy(stream: BinaryIO, suffix: str) -> np.ndarray:
    try:
        loaded = np.load(stream, allow_pickle=False)
    except (OSError, EOFError, ValueError) as error:
        raise ValueError(f"cannot be read as {suffix} ({_reason(error)})") from error
    if suffix != ".npz":
        return loaded
    with loaded as archive:
        names = list(archive.files)
        chosen = names[0] if len(names) == 1 else next((n for n in NPZ_KEYS if n in names), None)
        if chosen is None:
            raise ValueError(f"holds arrays {', '.join(names) or '(none)'}: give one array, or name it one "
                             f"of {', '.join(NPZ_KEYS)}")
        return archive[chosen]


def _reason(error: BaseException) -> str:
    text = getattr(error, "strerror", None) or str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text or type(error).__name__


def _read_csv(stream: BinaryIO) -> np.ndarray:
    try:
        with io.TextIOWrapper(stream, encoding="utf-8", newline="") as handle:
            rows = [row for row in csv.reader(handle) if row]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"cannot be read as .csv ({_reason(error)})") from error
    if rows and not _numbers(rows[0]):
        rows = rows[1:]  # a header
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        raise ValueError(f"has rows of {' and '.join(map(str, sorted(widths)))} columns: each row needs the same")
    try:
        return np.asarray(rows, dtype=np.float64)  # float() on each value, in C: 5x faster than a loop here
    except ValueError:
        pass  # find the row, for the message
    for index, row in enumerate(rows):
        if not _numbers(row):
            raise ValueError(f"row {index} holds a value that is not a number ({','.join(row)[:60]})")
    return np.asarray([[float(value) for value in row] for row in rows], dtype=np.float64)


def _numbers(row: Sequence[str]) -> bool:
    try:
        [float(value) for value in row]
    except ValueError:
        return False
    return True


def table_samples(inputs: Iterable[str], prepare: Callable[[np.ndarray], np.ndarray],
                  shape: Tuple[int, ...], what: str, batched: bool = False) -> Iterator[Sample]:
    """``(FILE:ROW, prepare(row), None)`` for every row of every table in `inputs`; a file that is not a table of
    rows of `shape` (`what` says what a row is, for the message) gives one ``(FILE, None, error)`` instead.

    A row may be given flat (``64`` numbers for an ``8 x 8`` image): it is reshaped to `shape`. A row holding NaN
    or inf is not prepared: it gives ``(FILE:ROW, None, NonFiniteInput(...))``.

    Args:
        batched: `prepare` takes a block of rows (``[N, *shape]``) and returns their N samples: NumPy's
            arithmetic once a block, not once a row (blocks of :data:`PREPARE_ROWS`).
    """
    for item in inputs:
        path = Path(item)
        try:
            rows = read_table(path)
            if rows.shape[1:] != tuple(shape):
                if int(np.prod(rows.shape[1:])) != int(np.prod(shape)):
                    raise ValueError(f"holds rows of shape {rows.shape[1:]}: {what} is {tuple(shape)} "
                                     f"({int(np.prod(shape))} values a row)")
                rows = rows.reshape((len(rows), *shape))
        except DataError as error:  # the file itself (missing, a FIFO...): the message names it
            yield str(path), None, str(error)
            continue
        except ValueError as error:
            yield str(path), None, f"{path} {error}"
            continue
        finite = (np.isfinite(rows.reshape(len(rows), -1)).all(axis=1) if np.issubdtype(rows.dtype, np.inexact)
                  else np.ones(len(rows), bool))
        step = PREPARE_ROWS if batched else 1
        for start in range(0, len(rows), step):
            block, good = rows[start:start + step], finite[start:start + step]
            kept = block if good.all() else block[good]
            prepared = iter((prepare(kept) if batched else [prepare(row) for row in kept]) if len(kept) else [])
            for index, is_finite in enumerate(good.tolist(), start):
                if is_finite:
                    yield f"{path}:{index}", next(prepared), None
                else:
                    values = rows[index].reshape(-1)
                    yield f"{path}:{index}", None, NonFiniteInput(
                        f"{path}, row {index} holds {values[~np.isfinite(values)][0]}")


def read_image(path: Path, channels: int) -> np.ndarray:
    """An image file as HWC uint8 with `channels` (1: grayscale, 3: RGB) channels.

    Raises:
        DataError: the file is missing, not a regular file, or has more pixels than Pillow's bound, naming it.
        ValueError: the file cannot be read or decoded (truncated, not an image, a format the decoder does not know).
    """
    data = read_input(path)  # DataError naming the file unless a regular file
    try:
        with opened_image(io.BytesIO(data), path):  # DataError past the pixel bound, before any decoding
            pass
        image = vision.Decode(to_pil=True)(np.frombuffer(data, dtype=np.uint8))
        array = np.asarray(image.convert("L" if channels == 1 else "RGB"))
    except DataError:
        raise
    except (OSError, ValueError, RuntimeError, SyntaxError) as error:  # PIL raises SyntaxError for some bad headers
        raise ValueError(f"cannot be read as an image ({_reason(error)})") from error
    return array[..., None] if array.ndim == 2 else array


def image_samples(inputs: Iterable[str], prepare: Callable[[np.ndarray], np.ndarray], channels: int,
                  table: Optional[Callable[[Iterable[str]], Iterator[Sample]]] = None) -> Iterator[Sample]:
    """``(PATH, prepare(HWC uint8 image), None)`` for every image file in `inputs` and under its folders (sorted,
    files with an image suffix); tables go to `table` where given. A file that cannot be decoded, or a folder
    without images, gives one ``(PATH, None, error)``."""
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            # not only regular files: a FIFO named x.png gets its line (read_image refuses it) rather than none
            files = sorted(p for p in path.rglob("*") if not p.is_dir() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                yield str(path), None, f"{path} holds no image files ({', '.join(IMAGE_SUFFIXES)})"
        elif table is not None and path.suffix.lower() in TABLE_SUFFIXES:
            yield from table([item])
            continue
        else:
            files = [path]
        for file in files:
            try:
                image = read_image(file, channels)
            except DataError as error:
                yield str(file), None, str(error)
                continue
            except ValueError as error:
                yield str(file), None, f"{file} {error}"
                continue
            yield str(file), prepare(image), None
