"""scikit-learn's handwritten digits (1,797 8x8 grayscale images) as a data module.

Small enough to train a real classifier on CPU in seconds, so it serves smoke tests and examples where CIFAR-10
would need a 162 MiB download. scikit-learn is an optional dependency (`pip install 'trainkit[digits]'`); it is
imported by `prepare()`, so configuring this module does not need it.
"""
from __future__ import annotations

import gzip
import importlib.util
import math
from pathlib import Path
from typing import Iterable, Iterator, Optional, Tuple

import mindspore.dataset as ds
import numpy as np
from mindspore.dataset import vision

from trainkit.checks import check_int, check_split_fractions
from trainkit.data.array_batches import array_batches
from trainkit.data.cifar10 import check_shards
from trainkit.data.predict_inputs import Sample, table_samples
from trainkit.data.values import check_values
from trainkit.errors import ConfigError, DataError

NUM_SAMPLES = 1797
MIN_IMAGE_SIZE = 8
PIXEL_MAX = 16.0  # load_digits pixels are counts of set pixels in 4x4 blocks: 0..16


def load_digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images [N, 8, 8] float64, labels [N] int), read from the file scikit-learn bundles.

    ``sklearn.datasets.load_digits`` reads the same file with the same ``np.loadtxt`` call, but importing
    scikit-learn (and with it SciPy) costs 1.2 s, 12 % of the quick start's wall time; the file is found without
    importing the package. Falls back to ``load_digits`` where the file is not where scikit-learn keeps it.
    """
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):  # ValueError: a None in sys.modules (an import blocked on purpose)
        spec = None
    if spec is None:
        raise DataError("DigitsData needs scikit-learn, which is not installed: pip install 'trainkit[digits]' "
                        "(or pip install scikit-learn).")
    folders = list(spec.submodule_search_locations or [])
    path = next((Path(f) / "datasets" / "data" / "digits.csv.gz" for f in folders
                 if (Path(f) / "datasets" / "data" / "digits.csv.gz").is_file()), None)
    if path is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        data = np.loadtxt(lines, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


class DigitsData:
    """Digits data module: a deterministic stratified train/validation/test split, normalised with the train set's
    statistics. ``eval_dataset()`` is the validation split (best checkpoint, early stopping), ``test_dataset()`` the
    held-out test split nobody tuned on (``trainer.test``).

    Args:
        batch_size: training batch size; the last incomplete batch is dropped.
        eval_batch_size: evaluation batch size (None: same as batch_size); the last batch is kept.
        test_fraction: share of each class held out as the test set, in (0, 1). Each class contributes
            round(test_fraction * its count) images, at least 1 and at most all but one, so every class is in both.
        val_fraction: share of each class carved from the rest for validation, in (0, 1) (round(val_fraction *
            its count), at least 1, leaving at least one image to train on).
        split_seed: seed of the split alone (independent of the global shuffle seed), so runs that change the
            training seed still evaluate on the same images.
        image_size: side of the square images; 8 is the native size, larger sizes are bilinear upscales
            (for networks whose stem needs more than 8x8).
        num_parallel_workers: accepted for the config's sake and unused: the images are in memory, transformed
            once, and cut into batches by NumPy (``trainkit.data.array_batches``).

    After `prepare()`, `mean` and `std` hold the normalisation statistics (of pixel / 16 over the train split).
    """

    num_classes: int = 10
    values_checked = True  # prepare() checks every value (trainkit.data.check_values): no per-batch check
    image_channels: int = 1

    def __init__(self, batch_size: int = 32, eval_batch_size: Optional[int] = None, test_fraction: float = 0.2,
                 split_seed: int = 0, image_size: int = 8, num_parallel_workers: int = 1, val_fraction: float = 0.1):
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.eval_batch_size = self.batch_size if eval_batch_size is None else check_int(
            "eval_batch_size", eval_batch_size, 1)
        self.test_fraction, self.val_fraction = check_split_fractions(test_fraction, val_fraction)
        self.split_seed = check_int("split_seed", split_seed, 0)
        self.image_size = check_int("image_size", image_size, MIN_IMAGE_SIZE)
        self.num_parallel_workers = check_int("num_parallel_workers", num_parallel_workers, 1)
        self.mean: Optional[float] = None
        self.std: Optional[float] = None
        self._train: Optional[tuple] = None
        self._val: Optional[tuple] = None
        self._test: Optional[tuple] = None

    def __repr__(self) -> str:
        return (f"DigitsData(batch_size={self.batch_size}, eval_batch_size={self.eval_batch_size}, "
                f"test_fraction={self.test_fraction}, val_fraction={self.val_fraction}, split_seed={self.split_seed}, "
                f"image_size={self.image_size})")

    def prepare(self) -> None:
        """Load the digits bundled with scikit-learn (no download), split and normalise them."""
        images, labels = load_digits_arrays()
        images = np.asarray(images, dtype=np.float64)  # [N, 8, 8], 0..16
        labels = np.asarray(labels, dtype=np.int32)
        if images.shape[1:] != (8, 8) or len(images) != len(labels):
            raise DataError(f"scikit-learn's load_digits returned images of shape {images.shape} and "
                            f"{len(labels)} labels; expected [N, 8, 8] and N labels. Reinstall scikit-learn.")
        check_values("scikit-learn's load_digits", {"image": images}, {"label": labels}, self.num_classes)
        train_index, val_index, test_index = self.split(labels)
        scaled = images / PIXEL_MAX
        self.mean = float(scaled[train_index].mean())
        self.std = float(scaled[train_index].std())
        normalised = ((scaled - self.mean) / self.std).astype(np.float32)[..., None]  # HWC: [N, 8, 8, 1]
        self._train = (normalised[train_index], labels[train_index])
        self._val = (normalised[val_index], labels[val_index])
        self._test = (normalised[test_index], labels[test_index])

    def split(self, labels: np.ndarray) -> tuple:
        """Indices (train, validation, test), each sorted: per class, a `split_seed` permutation's first share goes
        to test, the next to validation, the rest to train (the test images do not depend on `val_fraction`)."""
        rng = np.random.default_rng(self.split_seed)
        train, val, test = [], [], []
        for label in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == label))
            count = min(len(members) - 1, max(1, round(self.test_fraction * len(members))))
            val_count = min(len(members) - count - 1, max(1, round(self.val_fraction * len(members))))
            test.append(members[:count])
            val.append(members[count:count + val_count])
            train.append(members[count + val_count:])
        return tuple(np.sort(np.concatenate(part)) for part in (train, val, test))

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """Shuffled batches of `batch_size` (last partial one dropped): "image" float32 [B, 1, S, S], "label" int32."""
        num_shards, shard_id = check_shards(num_shards, shard_id)
        images, labels = self._split_arrays("train")
        per_shard = math.ceil(len(labels) / num_shards)
        if per_shard < self.batch_size:
            raise ConfigError(f"batch_size={self.batch_size} is larger than the {per_shard} training images per shard "
                              f"({len(labels)} images, num_shards={num_shards}), so no full batch exists. Lower "
                              f"data.batch_size or data.test_fraction.")
        return self._pipeline(images, labels, True, self.batch_size, num_shards, shard_id)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """Validation images in index order, batches of `eval_batch_size` (the last one may be smaller).

        With num_shards > 1 shard k gets images k, k + num_shards, ...; shards are padded by repetition to equal
        sizes when the count is not a multiple of num_shards.
        """
        num_shards, shard_id = check_shards(num_shards, shard_id)
        images, labels = self._split_arrays("val")
        return self._pipeline(images, labels, False, self.eval_batch_size, num_shards, shard_id)

    def test_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The held-out test images, as ``eval_dataset`` gives the validation ones."""
        num_shards, shard_id = check_shards(num_shards, shard_id)
        images, labels = self._split_arrays("test")
        return self._pipeline(images, labels, False, self.eval_batch_size, num_shards, shard_id)

    def predict_samples(self, inputs: Iterable[str]) -> Iterator[Sample]:
        """For ``python -m trainkit.predict``: the rows of tables (``.csv``, ``.npy``, ``.npz``) of digits as
        ``load_digits`` gives them (64 pixel values 0..16 a row, or 8 x 8), with the evaluation transforms:
        normalised with the training split's statistics, resized to `image_size`, CHW. One
        ``(FILE:ROW, image, None)`` a row, or ``(FILE, None, why)`` for a file that cannot be read."""
        if self.mean is None:
            self.prepare()
        resize = vision.Resize((self.image_size, self.image_size)) if self.image_size != 8 else None

        def prepare(rows: np.ndarray) -> np.ndarray:  # [N, 8, 8] -> [N, 1, size, size], as _pipeline's images
            images = ((rows / PIXEL_MAX - self.mean) / self.std).astype(np.float32)[..., None]
            if resize is not None:
                images = np.stack([resize(image) for image in images])
            return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)

        return table_samples(inputs, prepare, (8, 8), "a digit (8 x 8 pixel values 0..16, as load_digits gives)",
                             batched=True)

    def _split_arrays(self, which: str) -> tuple:
        if self._train is None:
            self.prepare()
        assert self._train is not None and self._test is not None
        return {"train": self._train, "val": self._val, "test": self._test}[which]

    def _pipeline(self, images: np.ndarray, labels: np.ndarray, train: bool, batch_size: int,
                  num_shards: int, shard_id: int) -> ds.Dataset:
        """The images as the network takes them (resized, CHW: each image's transforms run once, here), in whole
        batches (``trainkit.data.array_batches``: the pipeline's cost is per row), shuffled every epoch if `train`."""
        if self.image_size != 8:
            resize = vision.Resize((self.image_size, self.image_size))
            images = np.stack([resize(image) for image in images])
        chw = np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # vision.HWC2CHW's values, the whole set at once
        return array_batches({"image": chw, "label": labels}, batch_size, shuffle=train, drop_remainder=train,
                             num_shards=num_shards, shard_id=shard_id)
