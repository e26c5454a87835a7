"""A data module for images kept as NumPy arrays in an ``.npz`` file (``images``: N x C x H x W, ``labels``: N).

What trainkit asks of a data module: ``num_classes`` and ``image_channels`` (read after ``prepare()``, to fill
the model's ``num_classes``/``in_channels`` left null), ``prepare()`` (check the files; raise ``DataError``
naming the path and the fix), and ``train_dataset``/``eval_dataset`` returning batched ``mindspore.dataset``
datasets with the columns ``image`` and ``label`` (``num_shards``/``shard_id`` split the training set between
data-parallel workers). ``prepare()`` checks every value with ``trainkit.data.check_values`` (finite images,
integer labels in ``[0, num_classes)``), so bad data stops before anything compiles.
"""
import zipfile
from pathlib import Path
from typing import Optional

import mindspore.dataset as ds
import numpy as np

from trainkit.data import check_values, num_classes_of
from trainkit.errors import DataError


class NpzImages:
    """Images and labels from `path`; the last `eval_fraction` of a seeded shuffle is held out for evaluation."""

    values_checked = True  # prepare() checks every value: trainkit need not check each batch of the first epoch

    def __init__(self, path: str, batch_size: int = 32, eval_fraction: float = 0.2, seed: int = 0,
                 num_classes: Optional[int] = None):
        self.path = Path(path)
        self.given_num_classes = num_classes  # None: 0..N-1 from the labels, every class present
        self.batch_size = batch_size
        self.eval_fraction = eval_fraction
        self.seed = seed
        self.num_classes: Optional[int] = None
        self.image_channels: Optional[int] = None
        self._splits = None

    def prepare(self) -> None:
        if not self.path.is_file():
            raise DataError(f"{self.path} does not exist: make it with python -m my_project.make_data {self.path}, "
                            "or set data.path to an .npz file holding images (N, C, H, W) and labels (N,)")
        try:
            with np.load(self.path) as arrays:
                if "images" not in arrays or "labels" not in arrays:
                    raise DataError(f"{self.path} must hold the arrays images and labels; it holds {list(arrays)}")
                images, labels = arrays["images"], arrays["labels"]
        except DataError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:  # not an .npz, or a damaged one
            raise DataError(f"{self.path} is not a NumPy .npz file ({error}): write one with "
                            "numpy.savez(path, images=..., labels=...)") from error
        if images.ndim != 4:
            raise DataError(f"{self.path}: images has shape {images.shape}; it must be (N, C, H, W)")
        classes = self.given_num_classes or num_classes_of(str(self.path), "labels", labels)
        check_values(str(self.path), {"images": images}, {"labels": labels}, num_classes=classes)
        images, labels = images.astype(np.float32), labels.astype(np.int32)
        order = np.random.default_rng(self.seed).permutation(len(images))
        held_out = int(len(images) * self.eval_fraction)
        train, evaluate = order[held_out:], order[:held_out]
        self._splits = {"train": (images[train], labels[train]), "eval": (images[evaluate], labels[evaluate])}
        self.num_classes, self.image_channels = classes, images.shape[1]

    def _dataset(self, split: str, shuffle: bool, num_shards: int, shard_id: int) -> ds.Dataset:
        images, labels = self._splits[split]
        data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=shuffle,
                                     num_shards=num_shards, shard_id=shard_id)
        return data.batch(self.batch_size, drop_remainder=shuffle)

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset("train", True, num_shards, shard_id)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset("eval", False, num_shards, shard_id)
