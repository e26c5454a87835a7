"""``check_values``: the values of a data set checked before anything compiles, one line for the first bad one.

The fit check (``trainkit.app.fit_check``) sees shapes and dtypes; values it cannot see do worse than crash. A NaN
image trains to the end with a finite loss (ReLU maps NaN to 0), an ``inf`` feature ends in a NaN evaluation, a
label of 10 in a 3-class set makes an 11-class model and a label of -1 crashes after compiling. Every data module
trainkit ships calls :func:`check_values` on all its arrays in ``prepare()``; a data module of your own can too.
The scan is vectorised (a min and a max per column while everything is valid: milliseconds for 100 MB).
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from trainkit.errors import DataError

__all__ = ["check_values", "num_classes_of"]


def check_values(source: str, features: Mapping[str, np.ndarray], labels: Optional[Mapping[str, np.ndarray]] = None,
                 num_classes: Optional[int] = None, batch: Optional[int] = None) -> None:
    """Raise DataError, one line naming `source`, the column, the first bad sample and what is valid, when a value is
    unusable.

    Args:
        source: what the arrays come from, as the message names it (a file, ``"scikit-learn's wine data"``).
        features: the input columns by name: numbers, every one finite.
        labels: the target columns by name: for a classification loss (`num_classes` given) integers (any dtype
            holding whole numbers) in ``[0, num_classes)``; otherwise numbers, every one finite.
        num_classes: the number of classes, or None for regression targets.
        batch: the batch these arrays are, for a source checked batch by batch (named in the message).

    Raises:
        DataError: a column is empty, not numeric, holds a non-finite value or an invalid label, or the columns
            have different numbers of samples.
    """
    columns = {**features, **(labels or {})}
    where = source if batch is None else f"{source}, batch {batch}"
    arrays = {}
    for name, values in columns.items():
        array = np.asarray(values)
        if array.ndim == 0:
            raise DataError(f"{where}: column {name!r} is a single value ({array!r}): it needs one entry per sample")
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise DataError(f"{where}: column {name!r} holds {array.dtype} values: it must hold numbers")
        arrays[name] = array
    sizes = {name: len(array) for name, array in arrays.items()}
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{name!r} {size}" for name, size in sizes.items())
        raise DataError(f"{where}: the columns have different numbers of samples ({shown}): each needs one entry "
                        "per sample")
    if arrays and not next(iter(sizes.values())):
        raise DataError(f"{where} holds no samples (columns {', '.join(map(repr, arrays))} are empty)")
    for name in features:
        _check_finite(where, name, arrays[name], "features must be finite numbers")
    for name in labels or {}:
        if num_classes is None:
            _check_finite(where, name, arrays[name], "regression targets must be finite numbers")
        else:
            _check_classes(where, name, arrays[name], int(num_classes))


def num_classes_of(source: str, name: str, labels: np.ndarray) -> int:
    """The number of classes of class labels 0..N-1, each present: a gap (labels 0, 1, 2 and 10) is a wrong label
    more often than six classes without a sample, so it raises DataError naming the first sample past the gap.

    Use it where a data module infers ``num_classes`` from its labels; pass the count explicitly when some classes
    really have no sample. The labels are checked as :func:`check_values` checks them.
    """
    array = np.asarray(labels)
    high = np.max(array) if array.size and np.issubdtype(array.dtype, np.number) else 0
    if array.size and np.issubdtype(array.dtype, np.number) and np.min(array) < 0:
        index = int(np.argmax(array.reshape(len(array), -1).min(axis=1) < 0))
        raise DataError(f"{source}: column {name!r}, sample {index} is {array.reshape(len(array), -1)[index].min()}: "
                        "class labels must be integers 0..N-1")
    check_values(source, {}, {name: array}, num_classes=int(high) + 1 if np.isfinite(high) and high >= 0 else 1)
    present = np.unique(array.astype(np.int64))
    count = int(present[-1]) + 1
    if len(present) == count:
        return count
    missing = sorted(set(range(count)) - set(present.tolist()))
    largest = array.reshape(len(array), -1).max(axis=1)
    index = int(np.argmax(largest > missing[0]))
    raise DataError(f"{source}: column {name!r}, sample {index} is {int(largest[index])} but no sample has label "
                    f"{_ranges(missing)}: class labels must be 0..N-1 with every class present (or give the data "
                    "module num_classes when some classes have no sample)")


def _ranges(values: list) -> str:
    return f"{values[0]}" if len(values) == 1 else f"{values[0]}..{values[-1]}" if len(values) == values[-1] - values[
        0] + 1 else ", ".join(map(str, values[:6])) + (", ..." if len(values) > 6 else "")


def _check_finite(where: str, name: str, array: np.ndarray, valid: str) -> None:
    if not np.issubdtype(array.dtype, np.floating) and not np.issubdtype(array.dtype, np.complexfloating):
        return  # integers and booleans are always finite
    if np.isfinite(array.min()) and np.isfinite(array.max()):  # NaN propagates through both; inf shows in one
        return
    rows = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
    index = int(np.argmax(rows))
    bad = array.reshape(len(array), -1)[index]
    raise DataError(f"{where}: column {name!r}, sample {index} holds {bad[~np.isfinite(bad)][0]} "
                    f"({int(rows.sum())} of {len(rows)} samples have non-finite values): {valid}")


def _check_classes(where: str, name: str, array: np.ndarray, num_classes: int) -> None:
    valid = f"class labels must be integers in [0, {num_classes})"
    flat = array.reshape(len(array), -1)
    if np.issubdtype(array.dtype, np.floating):
        whole = np.isfinite(flat) & (np.floor(flat) == flat)
        if not whole.all():
            index = int(np.argmax(~whole.all(axis=1)))
            value = flat[index][~whole[index]][0]
            raise DataError(f"{where}: column {name!r}, sample {index} is {value!r}, not a whole number: {valid} "
                            "(float labels are not rounded)")
    low, high = array.min(), array.max()
    if low >= 0 and high < num_classes:
        return
    rows = ((flat < 0) | (flat >= num_classes)).any(axis=1)
    index = int(np.argmax(rows))
    value = flat[index][(flat[index] < 0) | (flat[index] >= num_classes)][0]
    shown = int(value) if float(value).is_integer() else value
    raise DataError(f"{where}: column {name!r}, sample {index} is {shown} ({int(rows.sum())} of {len(rows)} out of "
                    f"range): {valid}")


class FirstEpochCheck:
    """A ``Dataset.map`` operation that checks each batch of the first epoch with :func:`check_values` and passes
    the batches on unchanged (later epochs are not checked: the same samples come again).

    For data modules that stream their samples (a ``GeneratorDataset`` over files), which ``prepare()`` cannot
    scan. MindSpore reports an exception raised inside a pipeline as a RuntimeError of many lines; the first problem
    is kept in :attr:`problem`, so the caller can raise it as the one line it is (:func:`checked_batches`).
    """

    def __init__(self, source: str, columns: list, num_classes: Optional[int], batches: int):
        self.source, self.columns, self.num_classes, self.batches = source, list(columns), num_classes, batches
        self.seen = 0
        self.problem: Optional[DataError] = None
        self.classes_from: Optional[str] = None  # where num_classes came from, when not the data module

    def __call__(self, *arrays):
        if self.seen < self.batches:
            self.seen += 1
            features, labels = dict(zip(self.columns[:-1], arrays[:-1])), {self.columns[-1]: arrays[-1]}
            classes = self.num_classes if np.issubdtype(np.asarray(arrays[-1]).dtype, np.integer) else None
            try:
                check_values(self.source, features, labels, num_classes=classes, batch=self.seen)
            except DataError as error:
                self.problem = DataError(f"{error} ({self.classes_from})") if self.classes_from else error
                raise self.problem from None
        return arrays if len(arrays) > 1 else arrays[0]


def checked_batches(dataset, source: str, num_classes: Optional[int] = None):
    """`dataset` (batched) with each batch of its first epoch checked by :class:`FirstEpochCheck`; returns the
    dataset and the check, whose ``problem`` names the first bad batch, column and sample."""
    columns = list(dataset.get_col_names())
    check = FirstEpochCheck(source, columns, num_classes, dataset.get_dataset_size())
    return dataset.map(operations=check, input_columns=columns, num_parallel_workers=1), check
