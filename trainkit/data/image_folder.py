"""A folder of images, one sub-folder per class (torchvision's ``ImageFolder`` layout), as a data module.

Layout under ``root``::

    root/<class>/*.jpg|png|bmp|tif     one folder, split by val_fraction/test_fraction and split_seed, or
    root/train/<class>/...             train/ (and, when there, val/ and test/): a split that is missing is
    root/val/<class>/...               carved from train/ as above
    root/test/<class>/...

Class names are the class folders' names in sorted order (class i is the i-th); val/ and test/ may lack a class
but may not add one. Files are read by MindSpore's ``ImageFolderDataset`` and decoded by its ``Decode`` (to RGB,
whatever the file's mode); the augmentations are ``data.augment`` (:mod:`trainkit.data.augment`).

Every file is checked before anything compiles (Pillow opens and fully decodes it, :mod:`trainkit.data.image_check`):
an unreadable or truncated image, a format the decoder does not know, an empty class folder, images of mixed
channel counts, an image of more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS``, and an entry that is not a
regular file (a FIFO, socket or device named ``x.jpg``, a folder named so) are refused in one line naming it.

Prediction (``predict_samples``): each input file (a folder: its images, recursively, sorted) is checked the
same way and prepared as evaluation images are -- resize, centre crop, normalise; never the training
augmentations. It yields ``(path, image float32 [3, S, S], None)``, or ``(path, None, error line)`` for a file
that cannot be read, and goes on with the next.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import mindspore.dataset as ds
import numpy as np
from mindspore.dataset import transforms, vision

from trainkit.checks import check_int
from trainkit.data.augment import batch_ops, describe, image_ops, image_stages, label_ops, parse_augment
from trainkit.data.cifar10 import check_shards, pipeline_workers
from trainkit.data.image_check import EXTENSIONS, check_channels, check_image, check_images, image_files
from trainkit.data.input_file import open_input, read_input
from trainkit.errors import ConfigError, DataError

log = logging.getLogger("trainkit")

SPLITS = ("train", "val", "test")
MIN_IMAGE_SIZE = 8


SIZE_SAMPLE = 64  # images whose headers give the folder's image size
FAR = 2.0  # data.image_size this many times the images' shorter side, or 1/FAR of it, is warned about


@dataclass
class FolderImageSize:
    """The median width, height and shorter side of a sample of a folder's images (their headers only)."""

    width: int
    height: int
    shorter: int
    sampled: int

    def describe(self) -> str:
        return f"images {self.width}x{self.height} (median of {self.sampled}, width x height)"

    def warning(self, image_size: int) -> Optional[str]:
        """A line when `image_size` is more than FAR times the median shorter side, or less than 1/FAR of it."""
        ratio = image_size / max(1, self.shorter)
        if ratio > FAR:
            return (f"data.image_size={image_size} is {ratio:.1f}x the folder's images (median shorter side "
                    f"{self.shorter} px): every image is enlarged, which adds no detail and costs {ratio ** 2:.0f}x "
                    f"the pixels; data.image_size={self.shorter} trains on what the images hold")
        if ratio < 1 / FAR:
            return (f"data.image_size={image_size} is {ratio:.2f}x the folder's images (median shorter side "
                    f"{self.shorter} px): the resize drops most of their detail; a larger data.image_size may "
                    "train better, at more cost")
        return None


def folder_image_size(paths: Sequence[Path], sample: int = SIZE_SAMPLE) -> FolderImageSize:
    """The median size of up to `sample` of `paths`, spread evenly over them, read from the files' headers (Pillow
    opens an image without decoding it): a millisecond or so, however large the images. The files were checked;
    each is opened through :func:`~trainkit.data.input_file.open_input` again (a FIFO swapped in is refused)."""
    from PIL import Image

    chosen = [paths[index] for index in np.unique(np.linspace(0, len(paths) - 1, min(sample, len(paths))).astype(int))]
    sizes = []
    for path in chosen:
        with open_input(path) as stream, Image.open(stream) as image:  # a regular file still, or one line
            sizes.append(image.size)
    widths, heights = np.array(sizes).T
    return FolderImageSize(int(np.median(widths)), int(np.median(heights)), int(np.median(np.minimum(widths, heights))),
                           len(sizes))


@dataclass
class _Split:
    """A split: the folder ImageFolderDataset reads, its class indexing, and the rows of it taken (None: all)."""

    folder: Path
    class_indexing: Dict[str, int]
    rows: Optional[np.ndarray]
    labels: np.ndarray  # of the rows taken

    def __len__(self) -> int:
        return len(self.labels)


class ImageFolderData:
    """Images in class folders: `prepare()` checks every file and splits them, then the datasets.

    Args:
        root: the folder of class folders, or of train/ (val/, test/) folders of class folders.
        image_size: side of the square images the network gets (>= 8).
        batch_size: training batch size; the last incomplete batch is dropped.
        eval_batch_size: evaluation batch size (None: same as batch_size); the last batch is kept.
        augment: a preset name or a mapping of keys (:mod:`trainkit.data.augment`): ``none`` by default.
        val_fraction: share of each class carved for validation when there is no val/ folder, in (0, 1).
        test_fraction: share of each class carved for the test set when there is no test/ folder, in [0, 1): 0
            carves none (a test set kept elsewhere): no test split, no test evaluation (``has_test_set``).
        split_seed: seed of the carving (independent of the training seed).
        num_parallel_workers: threads per pipeline stage (at most the machine's CPUs).

    After `prepare()`: ``class_names``, ``num_classes``, and ``image_channels`` (3: images are decoded to RGB).
    """

    values_checked = True  # prepare() decodes every file; pixels are bytes: no per-batch check
    image_channels: int = 3

    def __init__(self, root: Union[str, os.PathLike, None] = None, image_size: int = 224, batch_size: int = 32,
                 eval_batch_size: Optional[int] = None, augment: Union[None, str, Mapping[str, Any]] = "none",
                 val_fraction: float = 0.1, test_fraction: float = 0.1, split_seed: int = 0,
                 num_parallel_workers: int = 2):
        if not isinstance(root, (str, os.PathLike)) or not str(root):
            raise ConfigError(f"root must be the folder of class folders (data.root=DIR); got {root!r}")
        self.root = Path(os.path.expanduser(str(root))).resolve()
        self.image_size = check_int("image_size", image_size, MIN_IMAGE_SIZE)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.eval_batch_size = self.batch_size if eval_batch_size is None else check_int(
            "eval_batch_size", eval_batch_size, 1)
        self.augment = parse_augment(augment)
        for name, value, low in (("val_fraction", val_fraction, "("), ("test_fraction", test_fraction, "[")):
            if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0
                    or (low == "(" and float(value) == 0.0)):
                zero = " (0: no test split, for a test set kept elsewhere)" if low == "[" else ""
                raise ConfigError(f"{name} must be a number in {low}0, 1){zero}; got {value!r}")
        if float(val_fraction) + float(test_fraction) >= 1.0:
            raise ConfigError(f"val_fraction must leave images to train on: val_fraction + test_fraction < 1; got "
                              f"{val_fraction!r} + {test_fraction!r}")
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.split_seed = check_int("split_seed", split_seed, 0)
        self.num_parallel_workers = check_int("num_parallel_workers", num_parallel_workers, 1)
        self.class_names: Optional[List[str]] = None
        self.num_classes: Optional[int] = None
        self._splits: Optional[Dict[str, _Split]] = None

    def __repr__(self) -> str:
        return (f"ImageFolderData(root={str(self.root)!r}, image_size={self.image_size}, batch_size="
                f"{self.batch_size}, augment={describe(self.augment)})")

    # ---------------------------------------------------------------------------------------------- prepare
    def prepare(self) -> None:
        """Find the classes and the splits, check every image file, carve the missing splits."""
        if not self.root.is_dir():
            raise DataError(f"data.root={self.root} is not a folder: it must hold one folder of images per class "
                            "(or train/, val/ and test/ folders of them)")
        folders = {name: self.root / name for name in SPLITS if (self.root / name).is_dir()}
        train_folder = folders.get("train", self.root)
        classes = _class_folders(train_folder)
        if not classes:
            raise DataError(f"{train_folder} holds no class folders: put each class's images in a folder named "
                            "after the class (DIR/<class>/*.jpg)")
        self.class_names = classes
        self.num_classes = len(classes)
        indexing = {name: i for i, name in enumerate(classes)}
        files = {}
        for split, folder in [("train", train_folder)] + [(s, f) for s, f in folders.items() if s != "train"]:
            present = _class_folders(folder)
            extra = sorted(set(present) - set(classes))
            if extra:
                raise DataError(f"{folder / extra[0]} is a class folder that {train_folder} does not have: the "
                                f"classes are {', '.join(classes)}")
            files[split] = {name: image_files(folder / name) for name in present}
            for name in present:
                if not files[split][name]:
                    raise DataError(f"{folder / name} is an empty class folder: it holds no image "
                                    f"({', '.join(EXTENSIONS)})")
        every_file = [path for split in files.values() for paths in split.values() for path in paths]
        check_channels(check_images(every_file, self.num_parallel_workers))
        size = folder_image_size(every_file)
        labels = {split: np.concatenate([np.full(len(files[split][name]), indexing[name], np.int32)
                                         for name in sorted(files[split])]) for split in files}
        splits = {split: _Split(folders.get(split, train_folder), {n: indexing[n] for n in files[split]}, None,
                                labels[split]) for split in files}
        carve = [s for s in ("test", "val") if s not in folders and not (s == "test" and not self.test_fraction)]
        if carve:
            train_rows, carved = self._carve(labels["train"], carve)
            base = splits["train"]
            for split, rows in carved.items():
                splits[split] = _Split(base.folder, base.class_indexing, rows, base.labels[rows])
            splits["train"] = _Split(base.folder, base.class_indexing, train_rows, base.labels[train_rows])
        self._splits = splits
        log.info("image folder %s: %d classes; %s images%s; %s", self.root, self.num_classes,
                 ", ".join(f"{len(splits[s])} {s}" for s in SPLITS if s in splits),
                 "" if "test" in splits else ", no test split (data.test_fraction=0)", size.describe())
        warning = size.warning(self.image_size)
        if warning:
            log.warning(warning)

    def _carve(self, labels: np.ndarray, carve: Sequence[str]) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Rows (sorted) of the training folder for train and each split in `carve`: per class, a `split_seed`
        permutation's first share goes to test, the next to validation (as DigitsData splits), at least one image
        each while one is left to train on."""
        rng = np.random.default_rng(self.split_seed)
        fractions = {"test": self.test_fraction, "val": self.val_fraction}
        parts: Dict[str, List[np.ndarray]] = {s: [] for s in ("train", *carve)}
        for label in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == label))
            start = 0
            for split in carve:
                count = min(len(members) - start - 1, max(1, round(fractions[split] * len(members))))
                parts[split].append(members[start:start + count])
                start += count
            parts["train"].append(members[start:])
        rows = {s: np.sort(np.concatenate(p)).astype(np.int64) for s, p in parts.items()}
        for split in carve:
            if not len(rows[split]):
                raise DataError(f"{self.root}: every class has a single image, so no {split} split can be carved: "
                                f"add images or a {split}/ folder")
        return rows.pop("train"), rows

    # --------------------------------------------------------------------------------------------- datasets
    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """Shuffled, augmented batches: "image" float32 [B, 3, S, S], "label" int32 [B] (float32 [B, classes]
        one-hot mixed targets with MixUp/CutMix); the last incomplete batch is dropped."""
        num_shards, shard_id = check_shards(num_shards, shard_id)
        split = self._split("train")
        per_shard = math.ceil(len(split) / num_shards)
        if per_shard < self.batch_size:
            raise ConfigError(f"batch_size={self.batch_size} is larger than the {per_shard} training images per shard "
                              f"({len(split)} images, num_shards={num_shards}): lower data.batch_size")
        dataset = self._pipeline(split, True, num_shards, shard_id)
        dataset = dataset.batch(self.batch_size, drop_remainder=True)
        mixers = batch_ops(self.augment)
        if mixers:
            dataset = dataset.map(operations=mixers, input_columns=["image", "label"], num_parallel_workers=1)
        return dataset

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The validation images in folder order (class, then file name), evaluation transforms only."""
        return self._ordered("val", num_shards, shard_id)

    @property
    def has_test_set(self) -> bool:
        """Whether there is a test split: a test/ folder, or one carved (``test_fraction`` above 0)."""
        if self._splits is None:
            self.prepare()
        assert self._splits is not None
        return "test" in self._splits

    def test_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The test images, as ``eval_dataset`` gives the validation ones.

        Raises:
            ConfigError: there is no test split (``test_fraction=0`` and no test/ folder).
        """
        if not self.has_test_set:
            raise ConfigError(f"{self.root} has no test split (data.test_fraction=0 and no test/ folder): "
                              "evaluate the validation set (--split val), or set data.test_fraction above 0")
        return self._ordered("test", num_shards, shard_id)

    def split_labels(self, which: str) -> np.ndarray:
        """The labels of split `which` ("train", "val", "test") in the order its dataset reads them (unshuffled)."""
        return self._split(which).labels

    def _ordered(self, which: str, num_shards: int, shard_id: int) -> ds.Dataset:
        num_shards, shard_id = check_shards(num_shards, shard_id)
        dataset = self._pipeline(self._split(which), False, num_shards, shard_id)
        return dataset.batch(self.eval_batch_size, drop_remainder=False)

    def _split(self, which: str) -> _Split:
        if self._splits is None:
            self.prepare()
        assert self._splits is not None
        return self._splits[which]

    def _pipeline(self, split: _Split, train: bool, num_shards: int, shard_id: int) -> ds.Dataset:
        sampler = _sampler(split.rows, train, num_shards, shard_id)
        workers = pipeline_workers(self.num_parallel_workers)  # at most the CPUs: MindSpore raises past them
        dataset = ds.ImageFolderDataset(str(split.folder), sampler=sampler, extensions=list(_EXTENSIONS_BOTH_CASES),
                                        class_indexing=split.class_indexing, decode=False,
                                        num_parallel_workers=workers)
        before, random, after = self.image_stages(train)
        dataset = dataset.map(operations=[vision.Decode(), *before], input_columns="image",
                              num_parallel_workers=workers)
        if random:  # one thread: the draws do not depend on num_parallel_workers (see image_stages)
            dataset = dataset.map(operations=random, input_columns="image", num_parallel_workers=1)
        dataset = dataset.map(operations=after, input_columns="image", num_parallel_workers=workers)
        return dataset.map(operations=label_ops(self.augment, self.num_classes, train), input_columns="label",
                           num_parallel_workers=workers)

    def image_stages(self, train: bool) -> Tuple[list, list, list]:
        """The per-image ops in three stages (:func:`trainkit.data.augment.image_stages`): a subclass may swap
        the random stage for its own callables (bench.augment_accuracy runs torchvision's there)."""
        return image_stages(self.augment, self.image_size, train)

    # ------------------------------------------------------------------------------------------- prediction
    def predict_samples(self, inputs: Sequence[str]) -> Iterator[Tuple[str, Optional[np.ndarray], Optional[str]]]:
        """``(path, image, None)`` per image file prepared as evaluation images are, or ``(path, None, error)``;
        a folder stands for its image files (recursively, sorted)."""
        prepare = transforms.Compose([vision.Decode(), *image_ops(self.augment, self.image_size, train=False)])
        for given in inputs:
            # every entry but folders: a FIFO or device among the images gets its line (check_image refuses it)
            paths = sorted(p for p in Path(given).rglob("*") if not p.is_dir() and not p.name.startswith(".")) \
                if Path(given).is_dir() else [Path(given)]
            if not paths:
                yield str(given), None, f"{given} holds no image files"
            for path in paths:
                try:
                    check_image(path)
                    image = prepare(np.frombuffer(read_input(path), dtype=np.uint8))
                except DataError as error:
                    yield str(path), None, str(error)
                    continue
                except (RuntimeError, ValueError, OSError) as error:  # what Pillow read, MindSpore's decoder did not
                    yield str(path), None, f"{path} cannot be decoded: {str(error).strip().splitlines()[0]}"
                    continue
                yield str(path), np.asarray(image, dtype=np.float32), None


_EXTENSIONS_BOTH_CASES = tuple(sorted({e for ext in EXTENSIONS for e in (ext, ext.upper())}))


def _class_folders(folder: Path) -> List[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _sampler(rows: Optional[np.ndarray], shuffle: bool, num_shards: int, shard_id: int) -> ds.Sampler:
    """Every row of the folder, or `rows` only; shuffled each epoch or in order; sharded when num_shards > 1."""
    if rows is None:
        if num_shards > 1:
            return ds.DistributedSampler(num_shards, shard_id, shuffle=shuffle)
        return ds.RandomSampler() if shuffle else ds.SequentialSampler()
    subset = [int(i) for i in rows]
    if num_shards == 1:
        return ds.SubsetRandomSampler(subset) if shuffle else ds.SubsetSampler(subset)
    sampler = ds.DistributedSampler(num_shards, shard_id, shuffle=shuffle)
    sampler.add_child(ds.SubsetSampler(subset))
    return sampler
