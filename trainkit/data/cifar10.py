"""CIFAR-10 (binary version) as a data module, with the ResNet-50 migration example's preprocessing.

Layout expected under `root` (what the official `cifar-10-binary.tar.gz` extracts to)::

    root/cifar-10-batches-bin/data_batch_1.bin ... data_batch_5.bin   (train, 50,000 records)
    root/cifar-10-batches-bin/test_batch.bin                          (test, 10,000 records)

Splits: the official test file is the held-out test set (``test_dataset()``, evaluated once at the end with
``best.ckpt``); validation (``eval_dataset()``: the best checkpoint, early stopping) is carved from the training
files, ``val_fraction`` of them (5,000 of 50,000 by default, 500 per class), chosen by ``split_seed``; training uses
the rest. Choosing the checkpoint on the test records would bias the reported figure upward.

Each record is 3073 bytes: 1 label byte (0..9), then 1024 red, 1024 green and 1024 blue bytes of a 32x32 image.

Preprocessing follows the seed (MindSpore port of the PyTorch reference):
train: RandomCrop(32, padding 4) -> RandomHorizontalFlip(0.5) -> Resize -> Rescale(1/255) -> Normalize -> HWC2CHW;
eval: the same without the two random ops. The seed's PyTorch *test* transform also flips at random; that is a bug
(evaluation must be deterministic), so it is not copied. Resize is left out when `image_size == 32`: resizing
32 -> 32 is the identity, so the op would only cost time.

Reading: files of the official size (10,000 records each) go through MindSpore's C++ `Cifar10Dataset`, as in the
seed; it cannot read shorter files, so other sizes (subsets, generated test files) are read with NumPy into a
random-access `GeneratorDataset` that yields the same rows (about 3x slower at 32x32, negligible at 224x224).
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import re
import tempfile
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore.dataset import transforms, vision

from trainkit.checks import check_bool, check_int
from trainkit.data.download import download_file, extract_tar, file_md5
from trainkit.data.predict_inputs import Sample, image_samples, table_samples
from trainkit.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"  # as published on https://www.cs.toronto.edu/~kriz/cifar.html
ARCHIVE_NAME = "cifar-10-binary.tar.gz"
BATCHES_DIR = "cifar-10-batches-bin"
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
IMAGE_BYTES = 3 * 32 * 32
RECORD_BYTES = 1 + IMAGE_BYTES
OFFICIAL_RECORDS = 10000  # per file; MindSpore's Cifar10Dataset reads exactly this many records from each file
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2023, 0.1994, 0.2010)
MIN_IMAGE_SIZE = 8


# ----------------------------------------------------------------------------------------------- argument checks
def check_shards(num_shards: Any, shard_id: Any) -> Tuple[int, int]:
    """Validate data-parallel sharding arguments (one shard per device)."""
    num_shards = check_int("num_shards", num_shards, 1)
    shard_id = check_int("shard_id", shard_id, 0)
    if shard_id >= num_shards:
        raise ConfigError(f"shard_id must be in [0, num_shards - 1] = [0, {num_shards - 1}]; got {shard_id}")
    return num_shards, shard_id


def pipeline_workers(requested: int) -> int:
    """`requested` threads per pipeline stage, at most the machine's CPUs: MindSpore raises a ValueError past them,
    and ``data.num_parallel_workers`` is a key a resume may change, on another machine too."""
    return max(1, min(int(requested), os.cpu_count() or 1))


# ------------------------------------------------------------------------------------------------ record source
class _RecordSource:
    """Random-access CIFAR-10 records read with NumPy, for files whose record count is not the official 10,000.

    MindSpore's Cifar10Dataset reads exactly 10,000 records per file and fails on anything shorter, so subsets
    (and the small generated files used by tests) go through this source instead. It yields what Cifar10Dataset
    yields: an HWC uint8 image [32, 32, 3] and a uint32 scalar label.
    """

    def __init__(self, paths: Sequence[str]):
        records = np.concatenate([np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD_BYTES) for path in paths])
        self.labels = records[:, 0].astype(np.uint32)
        self.images = np.ascontiguousarray(records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        return self.images[index], np.array(self.labels[index], dtype=np.uint32)


def _subset_sampler(indices: np.ndarray, shuffle: bool, num_shards: int, shard_id: int) -> ds.Sampler:
    """A sampler over `indices` only: shuffled each epoch (dataset seed) or in order, sharded when num_shards > 1
    (shard k takes every num_shards-th record of the subset, padded by repetition to equal sizes)."""
    subset = [int(i) for i in indices]
    if num_shards == 1:
        return ds.SubsetRandomSampler(subset) if shuffle else ds.SubsetSampler(subset)
    sampler = ds.DistributedSampler(num_shards, shard_id, shuffle=shuffle)
    sampler.add_child(ds.SubsetSampler(subset))
    return sampler


class Cifar10Data:
    """CIFAR-10 data module: `prepare()` checks (or downloads) the files, then `train_dataset()`/`eval_dataset()`.

    Args:
        root: folder that holds `cifar-10-batches-bin/` (not that folder itself).
        image_size: side of the square images fed to the network (the seed uses 224 for ResNet-50); >= 8.
        batch_size: training batch size; the last incomplete batch is dropped.
        eval_batch_size: evaluation batch size (None: same as batch_size); the last batch is kept.
        augment: random crop (padding 4) and horizontal flip on the training set.
        download: when the files are missing or corrupt, download `url` into `root`, check `md5`, extract.
        num_parallel_workers: threads per pipeline stage.
        url: where to download the binary archive from (a mirror may be given).
        md5: expected MD5 of that archive; None skips the check (not recommended).
        val_fraction: share of the training records held out for validation, in (0, 1); balanced over the classes
            (classes take turns in a `split_seed` permutation), at least one record.
        split_seed: seed of that choice; the same seed gives the same split on every machine.
    """

    num_classes: int = 10
    values_checked = True  # prepare() reads every label byte; pixels are bytes: no per-batch check
    image_channels: int = 3

    def __init__(self, root: str, image_size: int = 224, batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 augment: bool = True, download: bool = False, num_parallel_workers: int = 2,
                 url: str = CIFAR10_URL, md5: Optional[str] = CIFAR10_MD5, val_fraction: float = 0.1,
                 split_seed: int = 0):
        if not isinstance(root, (str, os.PathLike)) or not str(root):
            raise ConfigError(f"root must be a path to the folder that holds {BATCHES_DIR}/; got {root!r}")
        self.root = os.path.abspath(os.path.expanduser(str(root)))
        self.image_size = check_int("image_size", image_size, MIN_IMAGE_SIZE)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.eval_batch_size = self.batch_size if eval_batch_size is None else check_int(
            "eval_batch_size", eval_batch_size, 1)
        self.augment = check_bool("augment", augment)
        self.download = check_bool("download", download)
        self.num_parallel_workers = check_int("num_parallel_workers", num_parallel_workers, 1)
        if not isinstance(url, str) or not url:
            raise ConfigError(f"url must be a non-empty string; got {url!r}")
        self.url = url
        if md5 is not None and not (isinstance(md5, str) and re.fullmatch(r"[0-9a-fA-F]{32}", md5)):
            raise ConfigError(f"md5 must be 32 hexadecimal digits or null; got {md5!r}")
        self.md5 = md5.lower() if md5 is not None else None
        if (isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real)
                or not 0.0 < float(val_fraction) < 1.0):
            raise ConfigError(f"val_fraction must be a number in (0, 1) (the share of the training records held out "
                              f"for validation); got {val_fraction!r}")
        self.val_fraction = float(val_fraction)
        self.split_seed = check_int("split_seed", split_seed, 0)
        self._prepared = False
        self._split: Optional[Tuple[np.ndarray, np.ndarray]] = None

    @property
    def folder(self) -> str:
        """The `cifar-10-batches-bin` folder the records are read from."""
        return os.path.join(self.root, BATCHES_DIR)

    def __repr__(self) -> str:
        return (f"Cifar10Data(root={self.root!r}, image_size={self.image_size}, batch_size={self.batch_size}, "
                f"eval_batch_size={self.eval_batch_size}, augment={self.augment}, download={self.download}, "
                f"val_fraction={self.val_fraction}, split_seed={self.split_seed})")

    # ---------------------------------------------------------------------------------------------- prepare
    def prepare(self) -> None:
        """Check the six binary files exist and are well-formed, downloading them first when allowed.

        Cheap (file sizes and a few label bytes), so it runs before any network is built; raises DataError
        naming the paths, what is wrong and how to fix it.
        """
        problems = self._problems()
        if problems and self.download:
            self._download_and_extract()
            problems = self._problems()
            if problems:
                raise DataError(f"CIFAR-10 in {self.folder} is still not usable after downloading {self.url}: "
                                f"{'; '.join(problems)}. The archive does not hold the CIFAR-10 binary version; "
                                f"check data.url.")
        elif problems:
            raise DataError(self._missing_message(problems))
        self._prepared = True

    def _problems(self) -> List[str]:
        """What is wrong with the files, one sentence per file (empty when everything is usable)."""
        if not os.path.isdir(self.folder):
            return [f"{self.folder} does not exist"]
        problems = []
        for name in TRAIN_FILES + TEST_FILES:
            path = os.path.join(self.folder, name)
            if not os.path.isfile(path):
                problems.append(f"{path} is missing")
                continue
            size = os.path.getsize(path)
            if size == 0 or size % RECORD_BYTES:
                problems.append(f"{path} is corrupt: its size is {size:,} bytes, not a positive multiple of the "
                                f"{RECORD_BYTES}-byte record (1 label byte + {IMAGE_BYTES} pixel bytes; the official "
                                f"files are {OFFICIAL_RECORDS * RECORD_BYTES:,} bytes)")
                continue
            labels = np.memmap(path, dtype=np.uint8, mode="r")[::RECORD_BYTES]  # every label byte, cheaply
            bad = np.flatnonzero(labels >= self.num_classes)
            if bad.size:
                problems.append(f"{path} is corrupt: record {bad[0]} has label {labels[bad[0]]} ({bad.size} records "
                                f"out of 0..9 in all), but CIFAR-10 labels are 0..9 (is it the CIFAR-100 binary "
                                f"version?)")
        return problems

    def _missing_message(self, problems: List[str]) -> str:
        expected = ", ".join(TRAIN_FILES + TEST_FILES)
        message = f"CIFAR-10 data is not usable: {'; '.join(problems)}."
        if os.path.isfile(os.path.join(self.root, TRAIN_FILES[0])):
            message += (f" {self.root} itself holds {TRAIN_FILES[0]}: data.root must be the folder that holds "
                        f"{BATCHES_DIR}/, here probably data.root={os.path.dirname(self.root)}.")
        archive = os.path.join(self.root, ARCHIVE_NAME)
        if os.path.isfile(archive):
            message += f" {archive} exists: data.download=true verifies and extracts it without downloading again."
        return (f"{message} Fix: pass data.download=true to download {self.url} (162 MiB) into {self.root}, or "
                f"data.root=PATH where PATH/{BATCHES_DIR}/ holds {expected}.")

    def _download_and_extract(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        archive = os.path.join(self.root, ARCHIVE_NAME)
        if os.path.isfile(archive) and (self.md5 is None or file_md5(archive) == self.md5):
            logger.info("Using the archive already downloaded at %s", archive)
        else:
            if self.md5 is None:
                logger.warning("data.md5 is null: the download from %s is not verified", self.url)
            download_file(self.url, archive, self.md5, fix_hint=(
                f"Or download it yourself and extract it into {self.root} (so that {self.folder} holds the .bin "
                f"files), then run without data.download."))
        # Extract next to the destination, then move the six files into place: an archive that turns out to be
        # damaged halfway leaves the previous state, never a mix that passes the size checks.
        with tempfile.TemporaryDirectory(prefix=".cifar10-extract-", dir=self.root) as staging:
            extracted = os.path.join(staging, BATCHES_DIR)
            try:
                extract_tar(archive, staging)
                if not os.path.isdir(extracted):
                    raise DataError(f"{archive} has no top-level {BATCHES_DIR}/ folder, so it is not the CIFAR-10 "
                                    f"binary archive.")
            except DataError as err:
                os.remove(archive)  # else the next run with data.download=true would reuse it
                raise DataError(f"{err} It came from {self.url} (or was already in {self.root}) and has been "
                                f"deleted. Check data.url and data.md5.") from err
            os.makedirs(self.folder, exist_ok=True)
            for name in sorted(os.listdir(extracted)):
                source = os.path.join(extracted, name)
                if os.path.isfile(source):
                    os.replace(source, os.path.join(self.folder, name))
        logger.info("Extracted %s into %s", archive, self.folder)

    # --------------------------------------------------------------------------------------------- datasets
    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """Shuffled, augmented (when `augment`) batches of `batch_size` from the training records not held out for
        validation; the last incomplete batch is dropped.

        Columns: "image" float32 [B, 3, image_size, image_size], "label" int32 [B]. With `num_shards` > 1 each
        shard reads a disjoint 1/num_shards of the records (padded by repetition to equal sizes).
        """
        num_shards, shard_id = check_shards(num_shards, shard_id)
        indices = self.split()[0]
        per_shard = math.ceil(len(indices) / num_shards)
        if per_shard < self.batch_size:
            raise ConfigError(f"batch_size={self.batch_size} is larger than the training records per shard: the "
                              f"files in {self.folder} hold {len(indices)} training records (validation held out), "
                              f"{per_shard} per shard with num_shards={num_shards}, so dropping the last incomplete "
                              f"batch leaves no batch at all. Lower data.batch_size.")
        sampler = _subset_sampler(indices, shuffle=True, num_shards=num_shards, shard_id=shard_id)
        dataset = self._source(TRAIN_FILES, "train", sampler)
        return self._pipeline(dataset, self._image_ops(train=True), self.batch_size, drop_remainder=True)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The validation records (carved from the training files) in file order, no augmentation, batches of
        `eval_batch_size` (the last one may be smaller).

        With `num_shards` > 1, shard k gets the k-th, (k + num_shards)-th, ... of them; when their count is not a
        multiple of num_shards, the last shards repeat a record or two so all shards have the same number.
        """
        num_shards, shard_id = check_shards(num_shards, shard_id)
        sampler = _subset_sampler(self.split()[1], shuffle=False, num_shards=num_shards, shard_id=shard_id)
        dataset = self._source(TRAIN_FILES, "train", sampler)
        return self._pipeline(dataset, self._image_ops(train=False), self.eval_batch_size, drop_remainder=False)

    def test_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        """The official test records in file order, as ``eval_dataset`` gives the validation ones."""
        num_shards, shard_id = check_shards(num_shards, shard_id)
        sampler = (ds.DistributedSampler(num_shards, shard_id, shuffle=False) if num_shards > 1
                   else ds.SequentialSampler())
        dataset = self._source(TEST_FILES, "test", sampler)
        return self._pipeline(dataset, self._image_ops(train=False), self.eval_batch_size, drop_remainder=False)

    def predict_samples(self, inputs: Iterable[str]) -> Iterator[Sample]:
        """For ``python -m trainkit.predict``: image files (resized to 32 x 32 first, as CIFAR-10's images are) and
        folders of them, or tables (``.npy``, ``.npz``, ``.csv``) of 32 x 32 x 3 (HWC) pixel values 0..255, with
        the evaluation transforms. One ``(input, image, None)`` each, or ``(input, None, why)``."""
        _, ops = self._image_ops(train=False)  # (random ops: none for evaluation, deterministic ops)

        def prepare(image: np.ndarray) -> np.ndarray:
            image = np.asarray(image, dtype=np.uint8)
            if image.shape[:2] != (32, 32):
                image = vision.Resize((32, 32))(image)
            for op in ops:
                image = op(image)
            return np.asarray(image, dtype=np.float32)

        def table(paths: Iterable[str]) -> Iterator[Sample]:
            return table_samples(paths, prepare, (32, 32, 3), "a CIFAR-10 image (32 x 32 x 3 values 0..255, HWC)")

        return image_samples(inputs, prepare, self.image_channels, table)

    def split(self) -> Tuple[np.ndarray, np.ndarray]:
        """Indices into the training records (file order, data_batch_1 first): (train, validation), each sorted.

        A `split_seed` permutation of the records is reordered so the classes take turns (the first record of each
        class, then the second, ...), and its first round(val_fraction * N) records (at least 1) are validation:
        the validation set is as balanced over the classes as its size allows, 500 per class on the official files.
        """
        if self._split is None:
            self._ensure_prepared()
            labels = np.concatenate([np.fromfile(os.path.join(self.folder, name), dtype=np.uint8)[::RECORD_BYTES]
                                     for name in TRAIN_FILES])
            count = len(labels)
            val_count = max(1, round(self.val_fraction * count))
            if val_count >= count:
                raise ConfigError(f"val_fraction={self.val_fraction} leaves no training record: the files in "
                                  f"{self.folder} hold {count} training records. Lower data.val_fraction.")
            order = np.random.default_rng(self.split_seed).permutation(count)
            turn = np.zeros(count, dtype=np.int64)  # turn[i]: how many records of its class come before it in order
            for label in np.unique(labels):
                members = np.flatnonzero(labels[order] == label)
                turn[members] = np.arange(len(members))
            interleaved = order[np.argsort(turn, kind="stable")]
            val = np.sort(interleaved[:val_count])
            train = np.sort(interleaved[val_count:])
            self._split = (train, val)
        return self._split

    def _ensure_prepared(self) -> None:
        if not self._prepared:
            self.prepare()

    def _records(self, names: Sequence[str]) -> int:
        self._ensure_prepared()
        return sum(os.path.getsize(os.path.join(self.folder, name)) // RECORD_BYTES for name in names)

    def _native_readable(self, names: Sequence[str], usage: str) -> bool:
        """True when MindSpore's Cifar10Dataset reads exactly these files: each holds the official 10,000 records
        and no other `.bin` file in the folder matches its name filter (it reads every `*data_batch*.bin` or
        `*test_batch*.bin` file it finds)."""
        marker = "data_batch" if usage == "train" else "test_batch"
        matched = {name for name in os.listdir(self.folder) if name.endswith(".bin") and marker in name}
        sizes_ok = all(os.path.getsize(os.path.join(self.folder, name)) == OFFICIAL_RECORDS * RECORD_BYTES
                       for name in names)
        return sizes_ok and matched == set(names)

    def _source(self, names: Sequence[str], usage: str, sampler: ds.Sampler) -> ds.Dataset:
        self._ensure_prepared()
        if self._native_readable(names, usage):
            return ds.Cifar10Dataset(self.folder, usage=usage, sampler=sampler,
                                     num_parallel_workers=pipeline_workers(self.num_parallel_workers))
        logger.info("Reading %s with NumPy: the files are not the official %d records each", usage, OFFICIAL_RECORDS)
        source = _RecordSource([os.path.join(self.folder, name) for name in names])
        return ds.GeneratorDataset(source, column_names=["image", "label"], sampler=sampler,
                                   num_parallel_workers=1, python_multiprocessing=False)

    def _image_ops(self, train: bool) -> Tuple[list, list]:
        """(the random ops, the deterministic ones after them): the random ones run in one thread (MindSpore gives
        each thread of a map its own random stream, so the crops and flips would otherwise depend on
        num_parallel_workers, a key a resume may change)."""
        random: list = []
        if train and self.augment:
            random += [vision.RandomCrop((32, 32), (4, 4, 4, 4)), vision.RandomHorizontalFlip(prob=0.5)]
        ops: list = []
        if self.image_size != 32:
            ops.append(vision.Resize((self.image_size, self.image_size)))  # bilinear, on uint8 like the reference
        ops += [vision.Rescale(1.0 / 255.0, 0.0), vision.Normalize(list(MEAN), list(STD)), vision.HWC2CHW()]
        return random, ops

    def _pipeline(self, dataset: ds.Dataset, image_ops: Tuple[list, list], batch_size: int,
                  drop_remainder: bool) -> ds.Dataset:
        workers = pipeline_workers(self.num_parallel_workers)
        dataset = dataset.map(operations=transforms.TypeCast(ms.int32), input_columns="label",
                              num_parallel_workers=workers)
        random, ops = image_ops
        if random:
            dataset = dataset.map(operations=random, input_columns="image", num_parallel_workers=1)
        dataset = dataset.map(operations=ops, input_columns="image", num_parallel_workers=workers)
        return dataset.batch(batch_size, drop_remainder=drop_remainder, num_parallel_workers=workers)
