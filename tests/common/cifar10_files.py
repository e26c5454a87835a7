"""Small generated CIFAR-10 files in the real binary format, so data tests never need the 162 MB download.

Format (https://www.cs.toronto.edu/~kriz/cifar.html, "Binary version"): each record is 1 label byte (0..9)
followed by 3072 pixel bytes: the 1024 red values, then 1024 green, then 1024 blue, each a 32x32 image
stored row-major. `data_batch_1.bin` .. `data_batch_5.bin` hold the training records, `test_batch.bin` the test
records, all inside a folder named `cifar-10-batches-bin/`.
"""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from typing import Dict

import numpy as np

BATCHES_DIR = "cifar-10-batches-bin"
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
RECORD_BYTES = 1 + 3 * 32 * 32


def encode_records(images: np.ndarray, labels: np.ndarray) -> bytes:
    """Bytes of records for `images` uint8 [N, 32, 32, 3] (HWC) and `labels` [N] in 0..9."""
    images = np.asarray(images, dtype=np.uint8)
    labels = np.asarray(labels, dtype=np.uint8)
    assert images.shape[1:] == (32, 32, 3) and labels.shape == images.shape[:1]
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), 3 * 32 * 32)  # R plane, G plane, B plane
    return np.concatenate([labels[:, None], planes], axis=1).tobytes()


def write_cifar10(root: str, train_per_file: int = 8, test_records: int = 16, seed: int = 0,
                  meta: bool = True) -> Dict[str, np.ndarray]:
    """Write random CIFAR-10 binary files into `<root>/cifar-10-batches-bin/` and return what was written.

    Five training files of `train_per_file` records each and one test file of `test_records` records.
    Returns `train_images` uint8 [5 * train_per_file, 32, 32, 3] (HWC, in file order: data_batch_1 first),
    `train_labels` int64 [5 * train_per_file], `test_images` uint8 [test_records, 32, 32, 3], `test_labels`.
    Labels cycle through all ten classes (shuffled) so every class appears when there are >= 10 records.
    """
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, BATCHES_DIR)
    os.makedirs(folder, exist_ok=True)

    def make(n: int):
        images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        labels = rng.permutation(np.arange(n) % 10).astype(np.int64)
        return images, labels

    train_images, train_labels = make(5 * train_per_file)
    for i, name in enumerate(TRAIN_FILES):
        part = slice(i * train_per_file, (i + 1) * train_per_file)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(encode_records(train_images[part], train_labels[part]))
    test_images, test_labels = make(test_records)
    with open(os.path.join(folder, TEST_FILE), "wb") as f:
        f.write(encode_records(test_images, test_labels))
    if meta:
        with open(os.path.join(folder, "batches.meta.txt"), "w") as f:
            f.write("\n".join(CLASS_NAMES) + "\n")
    return {"train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels}


def make_cifar10_archive(path: str, train_per_file: int = 8, test_records: int = 16, seed: int = 0) -> str:
    """Write a `.tar.gz` laid out like the official archive (top folder `cifar-10-batches-bin/`); return its MD5."""
    with tempfile.TemporaryDirectory() as staging:
        write_cifar10(staging, train_per_file=train_per_file, test_records=test_records, seed=seed)
        with tarfile.open(path, "w:gz") as tar:
            tar.add(os.path.join(staging, BATCHES_DIR), arcname=BATCHES_DIR)
    return file_md5(path)


def make_tar_gz(path: str, members: Dict[str, bytes]) -> str:
    """Write a `.tar.gz` holding regular files `name -> content` (names used as given, e.g. '../evil'); return MD5."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return file_md5(path)


def file_md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# The app tests write 5 x 10 training records and pass data.val_fraction=0.2: 40 records train (5 steps of 8), the
# other 10 validate, as the documented split rule below chooses them.
APP_TEST_VAL_FRACTION = "data.val_fraction=0.2"


def validation_indices(labels: np.ndarray, val_fraction: float, seed: int = 0) -> np.ndarray:
    """The training records `Cifar10Data` holds out for validation, by its documented rule written independently:
    a `seed` permutation (NumPy's default_rng), reordered so the classes take turns (each class's first record in
    that permutation, then each one's second, ...), its first round(val_fraction * N) records, sorted."""
    order = np.random.default_rng(seed).permutation(len(labels))
    seen: Dict[int, int] = {}
    keyed = []
    for position, index in enumerate(order):
        turn = seen.get(int(labels[index]), 0)
        seen[int(labels[index])] = turn + 1
        keyed.append((turn, position, int(index)))
    count = max(1, round(val_fraction * len(labels)))
    return np.sort([index for _, _, index in sorted(keyed)[:count]])
