"""scikit-learn's bundled tabular data sets (wine, breast cancer, iris, diabetes) as a data module.

No download, a few hundred rows each: a tabular classifier or a regression trains in seconds on a CPU, and the
module shows the data-module protocol for data that is not images -- any column names (``features``,
``target``: the first column is the network's input, the second the target) and the attributes that fill the
model's keys (``in_features``, ``out_features``, ``num_classes``). scikit-learn is imported by ``prepare()``
(``pip install 'trainkit[digits]'``).
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator, Optional, Tuple

import mindspore.dataset as ds
import numpy as np

from trainkit.checks import check_bool, check_int, check_split_fractions
from trainkit.data.array_batches import array_batches
from trainkit.data.cifar10 import check_shards
from trainkit.data.predict_inputs import Sample, table_samples
from trainkit.data.values import check_values, num_classes_of
from trainkit.errors import ConfigError, DataError

# name -> (scikit-learn loader, task)
DATASETS = {"wine": ("load_wine", "classification"), "breast_cancer": ("load_breast_cancer", "classification"),
            "iris": ("load_iris", "classification"), "diabetes": ("load_diabetes", "regression")}


class SklearnTabularData:
    """A scikit-learn toy data set split into train and test, features standardised with the train split's mean
    and standard deviation.

    Columns: ``features`` float32 ``(batch, in_features)``; ``target`` int32 class indices ``(batch,)`` for a
    classification set, float32 ``(batch, 1)`` for the regression set (the shape of a one-output model's output,
    so an element-wise loss compares like with like).

    Attributes (filled into the model's keys left null): ``in_features``; ``out_features`` (the classes, or 1);
    ``num_classes`` (None for regression). After ``prepare()``: ``feature_mean``, ``feature_std``.

    Args:
        dataset: ``wine``, ``breast_cancer``, ``iris`` (classification) or ``diabetes`` (regression).
        batch_size: training batch size; the last incomplete batch is dropped.
        eval_batch_size: evaluation batch size (None: the test split in one batch).
        test_fraction: share held out as the test set (``test_dataset()``, ``trainer.test``), in (0, 1); stratified
            by class for classification.
        val_fraction: share of the whole carved from the rest for validation (``eval_dataset()``: the best
            checkpoint, early stopping), in (0, 1), test_fraction + val_fraction < 1.
        split_seed: ``random_state`` of scikit-learn's ``train_test_split``.
        standardize: standardise the features (train-split statistics).
    """

    values_checked = True  # prepare() checks every value (trainkit.data.check_values): no per-batch check

    def __init__(self, dataset: str = "wine", batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 test_fraction: float = 0.2, split_seed: int = 0, standardize: bool = True,
                 val_fraction: float = 0.1):
        if dataset not in DATASETS:
            raise ConfigError(f"dataset must be one of {', '.join(DATASETS)}; got {dataset!r}")
        self.dataset = dataset
        self.loader, self.task = DATASETS[dataset]
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.eval_batch_size = None if eval_batch_size is None else check_int("eval_batch_size", eval_batch_size, 1)
        self.test_fraction, self.val_fraction = check_split_fractions(test_fraction, val_fraction)
        self.split_seed = check_int("split_seed", split_seed, 0)
        self.standardize = check_bool("standardize", standardize)
        self.in_features: Optional[int] = None
        self.out_features: Optional[int] = None
        self.num_classes: Optional[int] = None
        self.feature_mean: Optional[np.ndarray] = None
        self.feature_std: Optional[np.ndarray] = None
        self._train: Optional[tuple] = None
        self._val: Optional[tuple] = None
        self._test: Optional[tuple] = None

    def __repr__(self) -> str:
        return f"SklearnTabularData(dataset={self.dataset!r}, batch_size={self.batch_size})"

    def prepare(self) -> None:
        """Load the set from scikit-learn (bundled with it), split it and standardise the features."""
        try:
            import sklearn.datasets
            from sklearn.model_selection import train_test_split
        except ImportError as err:
            raise DataError("SklearnTabularData needs scikit-learn, which is not installed: pip install "
                            "'trainkit[digits]' (or pip install scikit-learn).") from err
        features, target = getattr(sklearn.datasets, self.loader)(return_X_y=True)
        features = np.asarray(features, np.float64)
        classification = self.task == "classification"
        source = f"scikit-learn's {self.loader}"
        if classification:
            target = np.asarray(target)
            num_classes_of(source, "target", target)  # integers 0..N-1, every class present
            target = target.astype(np.int32)
        else:
            target = np.asarray(target, np.float32).reshape(-1, 1)
        check_values(source, {"features": features}, {"target": target},
                     int(target.max()) + 1 if classification else None)
        train_x, test_x, train_y, test_y = train_test_split(
            features, target, test_size=self.test_fraction, random_state=self.split_seed,
            stratify=target if classification else None)
        train_x, val_x, train_y, val_y = train_test_split(  # validation carved from the rest, as the same share
            train_x, train_y, test_size=self.val_fraction / (1.0 - self.test_fraction), random_state=self.split_seed,
            stratify=train_y if classification else None)
        if self.standardize:
            self.feature_mean, self.feature_std = train_x.mean(axis=0), train_x.std(axis=0)
            self.feature_std[self.feature_std == 0] = 1.0
            train_x, val_x, test_x = ((x - self.feature_mean) / self.feature_std for x in (train_x, val_x, test_x))
        self._train = (train_x.astype(np.float32), train_y)
        self._val = (val_x.astype(np.float32), val_y)
        self._test = (test_x.astype(np.float32), test_y)
        self.in_features = features.shape[1]
        self.num_classes = int(target.max()) + 1 if classification else None
        self.out_features = self.num_classes if classification else 1

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """Shuffled batches of `batch_size`, the last partial one dropped."""
        features, target = self._arrays(train=True)
        return shuffled_row_batches(features, target, self.batch_size, num_shards, shard_id)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The validation split in order, in batches of `eval_batch_size` (the last one may be smaller)."""
        return self._ordered(self.eval_arrays, num_shards, shard_id)

    def test_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The held-out test split, as ``eval_dataset`` gives the validation one."""
        return self._ordered(self.test_arrays, num_shards, shard_id)

    def _ordered(self, arrays: tuple, num_shards: int, shard_id: int) -> ds.Dataset:
        features, target = arrays
        return ordered_row_batches(features, target, self.eval_batch_size, num_shards, shard_id)

    @property
    def eval_arrays(self) -> tuple:
        """The validation split as ``(features, target)`` NumPy arrays, as ``eval_dataset`` gives them."""
        self._arrays(train=True)
        return self._val

    @property
    def test_arrays(self) -> tuple:
        """The test split as ``(features, target)`` NumPy arrays, as ``test_dataset`` gives them."""
        self._arrays(train=True)
        return self._test

    def _arrays(self, train: bool) -> tuple:
        if self._train is None:
            self.prepare()
        return self._train if train else self._val

    def predict_samples(self, inputs: Iterable[str]) -> Iterator[Sample]:
        """For ``python -m trainkit.predict``: the rows of tables (``.csv``, ``.npy``, ``.npz``) of raw features
        (``in_features`` a row, in the loader's order), standardised with the training split's statistics. One
        ``(FILE:ROW, features, None)`` a row, or ``(FILE, None, why)`` for a file that cannot be read."""
        if self._train is None:
            self.prepare()

        def prepare(rows: np.ndarray) -> np.ndarray:
            if self.standardize:
                rows = (rows - self.feature_mean) / self.feature_std
            return np.asarray(rows, dtype=np.float32)

        return table_samples(inputs, prepare, (self.in_features,), f"a row of {self.loader}'s {self.in_features} "
                                                                  "features", batched=True)


def ordered_row_batches(features, target, batch_size: Optional[int], num_shards: int = 1,
                        shard_id: int = 0, names: Tuple[str, str] = ("features", "target")) -> ds.Dataset:
    """A table's evaluation rows as "features"/"target" batches (the columns' `names`) of `batch_size` (None: the
    whole split in one), in row order, this shard's only, the last partial batch kept."""
    num_shards, shard_id = check_shards(num_shards, shard_id)
    return array_batches(dict(zip(names, (features, target))), batch_size or len(target), shuffle=False,
                         drop_remainder=False, num_shards=num_shards, shard_id=shard_id)


def shuffled_row_batches(features, target, batch_size: int, num_shards: int = 1, shard_id: int = 0,
                         names: Tuple[str, str] = ("features", "target")) -> ds.Dataset:
    """A table's training rows as "features"/"target" batches (the columns' `names`) of `batch_size`, shuffled,
    this shard's only, the last partial batch dropped; ConfigError when a shard holds fewer rows than one batch."""
    num_shards, shard_id = check_shards(num_shards, shard_id)
    per_shard = math.ceil(len(target) / num_shards)
    if per_shard < batch_size:
        raise ConfigError(f"batch_size={batch_size} is larger than the {per_shard} training rows per shard "
                          f"({len(target)} rows, num_shards={num_shards}): lower data.batch_size")
    return array_batches(dict(zip(names, (features, target))), batch_size, shuffle=True, drop_remainder=True,
                         num_shards=num_shards, shard_id=shard_id)


class RowSplitDatasets:
    """The datasets of a data module whose splits are arrays of rows, ``_split(which) -> (inputs, targets)``
    (``data=table``, ``data=text``): shuffled training batches, ordered evaluation ones, the test split if held out.
    A subclass sets ``columns`` (the two column names) and has ``path``, ``batch_size``, ``eval_batch_size`` and
    ``test_fraction``."""

    columns: Tuple[str, str] = ("features", "target")

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """Shuffled batches of `batch_size` (the last partial one dropped)."""
        inputs, targets = self._split("train")
        return shuffled_row_batches(inputs, targets, self.batch_size, num_shards, shard_id, self.columns)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The validation rows in table order, in batches of `eval_batch_size` (the last one may be smaller)."""
        return self._ordered("val", num_shards, shard_id)

    @property
    def has_test_set(self) -> bool:
        """Whether rows are held out for the test set (``test_fraction`` above 0)."""
        return self.test_fraction > 0

    def test_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The test rows, as ``eval_dataset`` gives the validation ones.

        Raises:
            ConfigError: no rows are held out (``test_fraction=0``).
        """
        if not self.has_test_set:
            raise ConfigError(f"{self.path} has no test split (data.test_fraction=0): evaluate the validation set "
                              "(--split val), or set data.test_fraction above 0")
        return self._ordered("test", num_shards, shard_id)

    def split_arrays(self, which: str) -> Tuple[np.ndarray, np.ndarray]:
        """Split `which` ("train", "val", "test") as ``(inputs, targets)`` arrays, in table order."""
        return self._split(which)

    def _ordered(self, which: str, num_shards: int, shard_id: int) -> ds.Dataset:
        inputs, targets = self._split(which)
        return ordered_row_batches(inputs, targets, self.eval_batch_size, num_shards, shard_id, self.columns)
