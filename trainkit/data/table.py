"""A CSV or Parquet table as a data module: ``data=table data.path=FILE data.target=COLUMN``.

Columns: ``target`` is what the network predicts; the features are every other column, or ``features``. A
feature column holding text (or listed in ``categorical``) is categorical: one-hot encoded over the categories of
the training split (a category the training split lacks encodes as all zeros). Every other feature is numeric,
standardised with the training split's mean and standard deviation (``standardize``).

The task: ``classification`` when the target holds text, or whole numbers with at most ``max_classes`` distinct
values; ``regression`` otherwise; ``task`` says it outright. Classes are the target's distinct values, sorted
(numbers by value), named as the file writes them (``class_names``).

Missing values (an empty CSV cell, ``NA``, ``NaN``, ``null``...; a Parquet null) are refused in one line naming the
column and the row, unless ``fill`` says how to fill them: a numeric column with the training split's ``mean``,
``median``, ``most_frequent`` value or ``zero``; a categorical column always with its most frequent training
category. A missing target is always refused. Rows are numbered from 0 (the first row below the header).

Splits: ``test_fraction`` then ``val_fraction`` of the rows, by ``split_seed`` (per class for a classification).

What the run keeps: :meth:`state_dict` holds the columns, the categories, the means, standard deviations and fill
values, and the classes; the app stores it in the run directory and its checkpoints
(:mod:`trainkit.rundir.data_state`), and :meth:`load_state_dict` gives it to a new module, so a prediction applies
the training split's statistics without the training file.

Prediction (``predict_samples``): each input is a table file; each row is a sample. It yields ``(row number,
features float32 [in_features], None)``, or ``(row number, None, error line)`` for a row that cannot be encoded (a
missing value without ``fill``, text in a numeric column); a file that cannot be read yields one
``(path, None, error line)``. With several files the ids are ``path:row``. The target column may be absent.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from trainkit.checks import check_bool, check_int
from trainkit.data.table_file import SUFFIXES, Table, read_table
from trainkit.data.tabular import RowSplitDatasets
from trainkit.data.values import check_values
from trainkit.errors import ConfigError, DataError

log = logging.getLogger("trainkit")

TASKS = ("auto", "classification", "regression")
FILLS = ("mean", "median", "most_frequent", "zero")
STATE_VERSION = 1


class TableData(RowSplitDatasets):
    """Rows of a table, encoded and split.

    Args:
        path: the .csv or .parquet file.
        target: the column to predict.
        features: the feature columns (None: every column but the target).
        categorical: the feature columns to one-hot encode (None: those holding text).
        task: auto, classification or regression.
        max_classes: with task=auto, whole-number targets with at most this many distinct values are classes.
        fill: how missing feature values are filled (None: refused): mean, median, most_frequent or zero.
        standardize: standardise the numeric features (training split's mean and standard deviation).
        batch_size: training batch size; the last incomplete batch is dropped.
        eval_batch_size: evaluation batch size (None: the split in one batch).
        test_fraction: share of the rows held out as the test set, in [0, 1): 0 holds none out (a test set kept
            elsewhere): no test split, no test evaluation (``has_test_set``).
        val_fraction: share of the rows carved for validation, in (0, 1), test_fraction + val_fraction < 1.
        split_seed: seed of the split.

    After ``prepare()``: ``in_features``, ``out_features`` (the classes, or 1), ``num_classes`` and
    ``class_names`` (None for a regression), ``statistics`` (what :meth:`state_dict` returns).
    """

    values_checked = True  # prepare() checks every value (trainkit.data.check_values)

    def __init__(self, path: Union[str, os.PathLike, None] = None, target: Optional[str] = None,
                 features: Optional[Sequence[str]] = None, categorical: Optional[Sequence[str]] = None,
                 task: str = "auto", max_classes: int = 20, fill: Optional[str] = None, standardize: bool = True,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None, test_fraction: float = 0.2,
                 val_fraction: float = 0.1, split_seed: int = 0):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ConfigError(f"path must be a .csv or .parquet file (data.path=FILE); got {path!r}")
        # absolute, links kept: a link named x.csv to /dev/zero is refused as what it is, not for its target's name
        self.path = Path(os.path.abspath(os.path.expanduser(str(path))))
        if self.path.suffix.lower() not in SUFFIXES:
            raise ConfigError(f"path must be a .csv or .parquet file; got {str(path)!r}")
        if not isinstance(target, str) or not target:
            raise ConfigError(f"target must name the column to predict (data.target=COLUMN); got {target!r}")
        self.target = target
        self.features = _names("features", features)
        self.categorical = _names("categorical", categorical)
        if task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
        self.task = task
        self.max_classes = check_int("max_classes", max_classes, 2)
        if fill is not None and fill not in FILLS:
            raise ConfigError(f"fill must be null (missing values refused) or one of {', '.join(FILLS)}; got {fill!r}")
        self.fill = fill
        self.standardize = check_bool("standardize", standardize)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.eval_batch_size = None if eval_batch_size is None else check_int("eval_batch_size", eval_batch_size, 1)
        for name, value, low in (("test_fraction", test_fraction, "["), ("val_fraction", val_fraction, "(")):
            if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0
                    or (low == "(" and float(value) == 0.0)):
                zero = " (0: no test split, for a test set kept elsewhere)" if low == "[" else ""
                raise ConfigError(f"{name} must be a number in {low}0, 1){zero}; got {value!r}")
        if float(test_fraction) + float(val_fraction) >= 1.0:
            raise ConfigError(f"val_fraction must leave rows to train on: test_fraction + val_fraction < 1; got "
                              f"{test_fraction!r} + {val_fraction!r}")
        self.test_fraction, self.val_fraction = float(test_fraction), float(val_fraction)
        self.split_seed = check_int("split_seed", split_seed, 0)
        self.statistics: Optional[Dict[str, Any]] = None
        self.in_features: Optional[int] = None
        self.out_features: Optional[int] = None
        self.num_classes: Optional[int] = None
        self.class_names: Optional[List[str]] = None
        self._arrays: Optional[Dict[str, Tuple[np.ndarray, np.ndarray]]] = None

    def __repr__(self) -> str:
        return f"TableData(path={str(self.path)!r}, target={self.target!r}, task={self.task!r})"

    # ---------------------------------------------------------------------------------------------- prepare
    def prepare(self) -> None:
        """Read the table, decide the task, split the rows, fit the statistics on the training split, encode."""
        table = read_table(self.path)
        columns = list(table.columns)
        if self.target not in table.columns:
            raise ConfigError(f"data.target={self.target} is not a column of {self.path}: its columns are "
                              f"{', '.join(columns)}")
        features = self.features if self.features is not None else [c for c in columns if c != self.target]
        for name, listed in (("features", features), ("categorical", self.categorical or [])):
            for column in listed:
                if column not in table.columns or column == self.target:
                    raise ConfigError(f"data.{name} names {column!r}, which is not a feature column of {self.path}: "
                                      f"its columns are {', '.join(c for c in columns if c != self.target)}")
        if not features:
            raise ConfigError(f"{self.path} has no feature column besides the target {self.target!r}")
        categorical = [c for c in features if c in (self.categorical or []) or
                       (self.categorical is None and not table.numeric[c])]
        for column in features:
            values = [v for v in table.columns[column] if v is not None]
            numbers = sum(_float(v) is not None for v in values)
            listed = self.categorical is not None and column in self.categorical
            if not table.numeric[column] and not listed and (column not in categorical or 2 * numbers > len(values)):
                # a column of numbers with a stray word: a typo, not categories
                row = next(r for r, v in enumerate(table.columns[column]) if v is not None and _float(v) is None)
                raise DataError(f"{self.path}: column {column!r} holds text ({table.columns[column][row]!r} in row "
                                f"{row}) among numbers: fix the value, or list the column in data.categorical")
        task, classes, labels = self._target(table)
        train, val, test = split_rows(labels if task == "classification" else None, table.rows, self.test_fraction,
                                  self.val_fraction, self.split_seed)
        self.statistics = {"version": STATE_VERSION, "target": self.target, "task": task, "classes": classes,
                           "features": features,
                           "numeric": {c: self._numeric_statistics(table, c, train) for c in features
                                       if c not in categorical},
                           "categorical": {c: self._categories(table, c, train) for c in categorical}}
        self._set_shapes()
        encoded, problems = encode(table, self.statistics, self.fill is not None)
        if problems:
            row, message = problems[0]
            raise DataError(f"{self.path}: {message}")
        target = labels.astype(np.int32) if task == "classification" else labels.astype(np.float32).reshape(-1, 1)
        check_values(str(self.path), {"features": encoded}, {"target": target}, self.num_classes)
        self._arrays = {name: (encoded[rows], target[rows]) for name, rows in
                        (("train", train), ("val", val), ("test", test))}
        log.info("table %s: %d rows (%d train, %d val, %d test), %d features -> %d inputs, %s", self.path,
                 table.rows, len(train), len(val), len(test), len(features), self.in_features,
                 f"{len(classes)} classes" if classes else "regression")

    def _target(self, table: Table) -> Tuple[str, Optional[List[str]], np.ndarray]:
        values = table.columns[self.target]
        missing = [r for r, v in enumerate(values) if v is None]
        if missing:
            more = f" ({len(missing)} rows in all)" if len(missing) > 1 else ""
            raise DataError(f"{self.path}: column {self.target!r} (the target) has no value in row {missing[0]}: a "
                            f"target is never filled; fix or remove the row{more}")
        numeric = table.numeric[self.target]
        task = self.task
        if task == "auto":
            whole = numeric and all(float(v).is_integer() for v in values)
            task = "classification" if not numeric or (whole and len(set(values)) <= self.max_classes) \
                else "regression"
        if task == "regression":
            if not numeric:
                row = next(r for r, v in enumerate(values) if _float(v) is None)
                raise DataError(f"{self.path}: column {self.target!r} holds text ({values[row]!r} in row {row}), so "
                                "it cannot be a regression target: set data.task=classification or fix the value")
            return task, None, np.asarray(values, np.float64)
        texts = [class_name(v) for v in values]
        classes = sorted(set(texts), key=lambda t: (float(t), t) if numeric else (0.0, t))
        if len(classes) < 2:
            raise DataError(f"{self.path}: column {self.target!r} holds a single class ({classes[0]!r}): a "
                            "classification needs at least two")
        index = {name: i for i, name in enumerate(classes)}
        return task, classes, np.asarray([index[t] for t in texts], np.int64)

    def _numeric_statistics(self, table: Table, column: str, rows: np.ndarray) -> Dict[str, float]:
        present = np.asarray([v for v in (table.columns[column][r] for r in rows) if v is not None], np.float64)
        if not len(present):
            raise DataError(f"{self.path}: column {column!r} has no value in any training row")
        fills = {"mean": present.mean(), "median": float(np.median(present)), "zero": 0.0}
        if self.fill == "most_frequent":
            values, counts = np.unique(present, return_counts=True)
            fills["most_frequent"] = float(values[np.argmax(counts)])
        filled = present
        fill = float(fills[self.fill]) if self.fill is not None else None
        if fill is not None:  # the statistics of the column as the network sees it: filled, then standardised
            filled = np.asarray([fill if v is None else v for v in (table.columns[column][r] for r in rows)],
                                np.float64)
        mean, std = (float(filled.mean()), float(filled.std())) if self.standardize else (0.0, 1.0)
        return {"mean": mean, "std": std if std > 0 else 1.0, "fill": fill}

    def _categories(self, table: Table, column: str, rows: np.ndarray) -> Dict[str, Any]:
        present = [class_name(v) for v in (table.columns[column][r] for r in rows) if v is not None]
        if not present:
            raise DataError(f"{self.path}: column {column!r} has no value in any training row")
        counts = Counter(present)
        categories = sorted(counts)
        return {"categories": categories, "fill": max(categories, key=lambda c: counts[c])}  # ties: the first

    # ---------------------------------------------------------------------------------------------- state
    def state_dict(self) -> Optional[Dict[str, Any]]:
        """What a prediction needs of the training data (JSON-able): columns, categories, statistics, classes."""
        return self.statistics

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take the statistics of a trained run (:meth:`state_dict`), for :meth:`predict_samples`."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or state.get("target") != self.target:
            raise DataError(f"the stored table statistics are not those of a table with target {self.target!r} "
                            f"(version {STATE_VERSION})")
        self.statistics = state
        self._set_shapes()

    def _set_shapes(self) -> None:
        stats = self.statistics
        self.in_features = len(stats["numeric"]) + sum(len(c["categories"]) for c in stats["categorical"].values())
        self.class_names = list(stats["classes"]) if stats["classes"] else None
        self.num_classes = len(self.class_names) if self.class_names else None
        self.out_features = self.num_classes or 1

    def _split(self, which: str) -> Tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self.prepare()
        assert self._arrays is not None
        return self._arrays[which]

    # ------------------------------------------------------------------------------------------- prediction
    def predict_samples(self, inputs: Sequence[str]) -> Iterator[Tuple[str, Optional[np.ndarray], Optional[str]]]:
        """``(row, features, None)`` per row of each table, encoded with the stored statistics, or
        ``(row, None, error)``; ``(path, None, error)`` for a table that cannot be read."""
        if self.statistics is None:
            self.prepare()
        for path in inputs:
            try:
                table = read_table(Path(path))
                absent = [c for c in self.statistics["features"] if c not in table.columns]
                if absent:
                    raise DataError(f"{path} lacks the feature column {absent[0]!r} the model was trained on")
            except DataError as error:
                yield str(path), None, str(error)
                continue
            encoded, problems = encode(table, self.statistics, self.fill is not None)
            bad = dict(problems)
            for row in range(table.rows):
                name = f"{path}:{row}" if len(inputs) > 1 else str(row)
                if row in bad:
                    yield name, None, f"{path}: {bad[row]}"
                else:
                    yield name, encoded[row], None


def encode(table: Table, statistics: Dict[str, Any], fill: bool) -> Tuple[np.ndarray, List[Tuple[int, str]]]:
    """The feature matrix of every row of `table` (float32 [rows, in_features]) under `statistics`, and the rows
    that cannot be encoded with their reason (a missing value without `fill`, text in a numeric column), in order
    of column, then row."""
    blocks, problems = [], []
    for column in statistics["features"]:
        values = table.columns[column]
        if column in statistics["numeric"]:
            stats = statistics["numeric"][column]
            block = np.zeros((table.rows, 1), np.float64)
            for row, value in enumerate(values):
                number = _float(value) if value is not None else None
                if value is None and not fill:
                    problems.append((row, f"column {column!r} has no value in row {row}: fill it in, or set "
                                          f"data.fill ({', '.join(FILLS)})"))
                elif value is not None and number is None:
                    problems.append((row, f"column {column!r} holds {value!r} in row {row}, not a number"))
                else:
                    block[row, 0] = ((stats["fill"] if value is None else number) - stats["mean"]) / stats["std"]
        else:
            stats = statistics["categorical"][column]
            index = {name: i for i, name in enumerate(stats["categories"])}
            block = np.zeros((table.rows, len(index)), np.float64)
            for row, value in enumerate(values):
                if value is None and not fill:
                    problems.append((row, f"column {column!r} has no value in row {row}: fill it in, or set "
                                          f"data.fill ({', '.join(FILLS)})"))
                    continue
                position = index.get(stats["fill"] if value is None else class_name(value))
                if position is not None:  # a category training never saw: all zeros
                    block[row, position] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1).astype(np.float32), problems


def _names(name: str, value: Optional[Sequence[str]]) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name} must be a list of column names or null; got {value!r}")
    return list(value)


def _float(value: object) -> Optional[float]:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def class_name(value: object) -> str:
    """A value as a category or class name: whole numbers without a decimal point (3.0 -> "3")."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def split_rows(labels: Optional[np.ndarray], rows: int, test_fraction: float, val_fraction: float,
               seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row numbers (train, val, test), each sorted: per class (a classification) or over all rows, a `seed`
    permutation's first share is test, the next validation, at least one each while one row is left to train.
    The split of every module of table rows (``data=table``, ``data=text``)."""
    rng = np.random.default_rng(seed)
    groups = [np.arange(rows)] if labels is None else [np.flatnonzero(labels == c) for c in np.unique(labels)]
    parts: Dict[str, List[np.ndarray]] = {"train": [], "val": [], "test": []}
    for members in groups:
        members = rng.permutation(members)
        test = min(len(members) - 1, max(1, round(test_fraction * len(members)))) if test_fraction else 0
        val = min(len(members) - test - 1, max(1, round(val_fraction * len(members))))
        parts["test"].append(members[:test])
        parts["val"].append(members[test:test + val])
        parts["train"].append(members[test + val:])
    train, val, test = (np.sort(np.concatenate(parts[s])).astype(np.int64) for s in ("train", "val", "test"))
    if not len(val) or (test_fraction and not len(test)):
        raise DataError(f"the table has too few rows ({rows}) to hold out a validation and a test split")
    return train, val, test
