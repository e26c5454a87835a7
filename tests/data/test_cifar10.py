"""Cifar10Data on small generated files in the real binary format, checked against NumPy arithmetic."""
import os

import mindspore.dataset as ds
import numpy as np
import pytest

from tests.common.cifar10_files import RECORD_BYTES, write_cifar10
from tests.common.cifar10_files import validation_indices as expected_validation
from trainkit.data import cifar10 as cifar10_module
from trainkit.data.cifar10 import Cifar10Data
from trainkit.errors import ConfigError, DataError

MEAN = np.array([0.4914, 0.4822, 0.4465])
STD = np.array([0.2023, 0.1994, 0.2010])
TRAIN_PER_FILE, TEST_RECORDS = 8, 16  # 40 train records, 16 test records


def normalised_chw(images_hwc: np.ndarray) -> np.ndarray:
    """The seed's arithmetic: x / 255, minus the channel mean, over the channel std, HWC -> CHW."""
    return ((images_hwc / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2)


def to_uint8_hwc(batch_chw: np.ndarray) -> np.ndarray:
    """Undo Normalize/Rescale/HWC2CHW (exact after rounding: float32 error is far below half a grey level)."""
    hwc = batch_chw.astype(np.float64).transpose(0, 2, 3, 1)
    return np.rint((hwc * STD + MEAN) * 255.0).astype(np.uint8)


def batches(dataset):
    return list(dataset.create_tuple_iterator(output_numpy=True, num_epochs=1))


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cifar"))
    written = write_cifar10(root, train_per_file=TRAIN_PER_FILE, test_records=TEST_RECORDS, seed=1)
    return root, written


@pytest.fixture
def seed():
    previous = ds.config.get_seed()
    ds.config.set_seed(1234)
    yield
    ds.config.set_seed(previous)


def record_index(image_hwc: np.ndarray, images: np.ndarray) -> int:
    matches = np.flatnonzero((images == image_hwc).all(axis=(1, 2, 3)))
    assert len(matches) == 1, "each output image must be exactly one record"
    return int(matches[0])


# ------------------------------------------------------------------------------------------------- eval pipeline
def test_test_images_are_normalised_records_of_the_test_file_in_order(cifar):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, eval_batch_size=5)
    data.prepare()
    out = batches(data.test_dataset())
    assert [len(b[1]) for b in out] == [5, 5, 5, 1]  # drop_remainder=False keeps the last one
    images, labels = np.concatenate([b[0] for b in out]), np.concatenate([b[1] for b in out])
    assert images.dtype == np.float32 and labels.dtype == np.int32
    np.testing.assert_allclose(images, normalised_chw(written["test_images"]), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(labels, written["test_labels"])


def numpy_bilinear_downsize(images_hwc: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize by a factor of 2 or 4 with half-pixel centres (OpenCV's INTER_LINEAR, which
    ``vision.Resize`` uses): output pixel (y, x) samples the source at (f*y + f/2 - 0.5, f*x + f/2 - 0.5), halfway
    between rows/columns f*y + f/2 - 1 and f*y + f/2, so it is the mean of that 2x2 block."""
    factor = images_hwc.shape[1] // size
    assert factor in (2, 4) and images_hwc.shape[1] == factor * size
    first = factor * np.arange(size) + factor // 2 - 1  # the upper/left row and column of each 2x2 block
    images = images_hwc.astype(np.float64)
    return sum(images[:, first + dy][:, :, first + dx] for dy in (0, 1) for dx in (0, 1)) / 4


@pytest.mark.parametrize("size", [8, 16])
def test_eval_resizes_to_image_size_as_numpy_bilinear(cifar, size):
    root, written = cifar
    data = Cifar10Data(root, image_size=size, eval_batch_size=16)
    (images, labels), = batches(data.test_dataset())
    assert images.shape == (16, 3, size, size) and images.dtype == np.float32 and labels.shape == (16,)
    expected = numpy_bilinear_downsize(written["test_images"], size)
    # uint8 in and out: the resize rounds to whole grey levels, so at most half a level from the exact mean
    np.testing.assert_allclose(to_uint8_hwc(images), expected, rtol=0, atol=0.5 + 1e-9)
    np.testing.assert_array_equal(labels, written["test_labels"])


def test_train_time_resize_without_augment_is_numpy_bilinear(cifar, seed):
    root, written = cifar
    data = Cifar10Data(root, image_size=8, batch_size=8, augment=False, val_fraction=0.2)
    train = sorted(set(range(40)) - set(expected_validation(written["train_labels"], 0.2, 0).tolist()))
    out = batches(data.train_dataset())
    assert len(out) == 4
    expected = numpy_bilinear_downsize(written["train_images"], 8)
    matched = []
    for images, labels in out:
        for image, label in zip(to_uint8_hwc(images), labels):
            distance = np.abs(expected - image).max(axis=(1, 2, 3))
            index = int(distance.argmin())
            assert distance[index] <= 0.5 + 1e-9, distance[index]
            assert label == written["train_labels"][index]
            matched.append(index)
    assert sorted(matched) == train  # every training record once, each resized as NumPy says


def test_eval_is_deterministic_even_with_augment_on(cifar):
    """The seed's test transform flips at random; ours must not (augment only affects training)."""
    root, _ = cifar
    data = Cifar10Data(root, image_size=32, eval_batch_size=16, augment=True)
    first, second = batches(data.eval_dataset()), batches(data.eval_dataset())
    np.testing.assert_array_equal(first[0][0], second[0][0])
    first, second = batches(data.test_dataset()), batches(data.test_dataset())
    np.testing.assert_array_equal(first[0][0], second[0][0])


# ------------------------------------------------------------------------------- train / validation / test split
@pytest.mark.parametrize("val_fraction, split_seed", [(0.1, 0), (0.25, 3)])
def test_validation_is_carved_from_train_balanced_and_seeded(cifar, val_fraction, split_seed):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, batch_size=4, eval_batch_size=64, augment=False,
                       val_fraction=val_fraction, split_seed=split_seed)
    expected = expected_validation(written["train_labels"], val_fraction, split_seed)
    (images, labels), = batches(data.eval_dataset())
    val = [record_index(image, written["train_images"]) for image in to_uint8_hwc(images)]
    assert val == expected.tolist()  # the validation records, in file order
    np.testing.assert_array_equal(labels, written["train_labels"][val])
    counts = np.bincount(written["train_labels"][val], minlength=10)
    assert counts.max() - counts.min() <= 1  # as balanced over the classes as the size allows
    ds.config.set_seed(7)
    train = [record_index(img, written["train_images"]) for b in batches(data.train_dataset())
             for img in to_uint8_hwc(b[0])]
    assert not set(train) & set(val), "no validation record may be trained on"
    assert len(train) == len(set(train)) == (40 - len(val)) // 4 * 4  # each record at most once, full batches
    test = [record_index(img, written["test_images"]) for b in batches(data.test_dataset())
            for img in to_uint8_hwc(b[0])]
    assert test == list(range(TEST_RECORDS))  # the test file, untouched by the split


def test_split_seed_changes_the_validation_records(cifar):
    root, written = cifar
    picked = [Cifar10Data(root, split_seed=seed).split()[1].tolist() for seed in (0, 0, 1)]
    assert picked[0] == picked[1] != picked[2]


# ------------------------------------------------------------------------------------------------ train pipeline
def test_train_batches_shapes_dtypes_and_drop_remainder(cifar, seed):
    root, written = cifar
    data = Cifar10Data(root, image_size=16, batch_size=16)
    dataset = data.train_dataset()
    out = batches(dataset)
    assert dataset.get_dataset_size() == 2 and len(out) == 2  # 36 training records: 2 full batches, 4 dropped
    for images, labels in out:
        assert images.shape == (16, 3, 16, 16) and images.dtype == np.float32
        assert labels.shape == (16,) and labels.dtype == np.int32
        assert set(labels.tolist()) <= set(range(10))


def test_train_without_augment_yields_each_record_at_most_once_shuffled(cifar, seed):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, batch_size=8, augment=False, val_fraction=0.2)
    train = sorted(set(range(40)) - set(expected_validation(written["train_labels"], 0.2, 0).tolist()))
    out = batches(data.train_dataset())
    assert len(out) == 4
    indices = [record_index(img, written["train_images"]) for b in out for img in to_uint8_hwc(b[0])]
    assert sorted(indices) == train
    assert indices != train, "the training set must be shuffled"
    labels = np.concatenate([b[1] for b in out])
    np.testing.assert_array_equal(labels, written["train_labels"][indices])


def test_train_augmentation_is_a_window_of_the_zero_padded_image_maybe_flipped(cifar, seed):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, batch_size=18, augment=True)
    padded = np.pad(written["train_images"], ((0, 0), (4, 4), (4, 4), (0, 0)))  # [40, 40, 40, 3]
    # windows[n, dy, dx] = padded[n, dy:dy + 32, dx:dx + 32]
    windows = np.lib.stride_tricks.sliding_window_view(padded, (32, 32), axis=(1, 2)).transpose(0, 1, 2, 4, 5, 3)
    candidates = {"plain": windows, "flipped": windows[:, :, :, :, ::-1]}
    offsets = set()
    for images, labels in batches(data.train_dataset()):
        for image, label in zip(to_uint8_hwc(images), labels):
            found = []
            for kind, w in candidates.items():
                # A centre patch lies inside the unpadded image for every offset: a cheap filter before the full test.
                near = np.nonzero((w[:, :, :, 12:20, 12:20] == image[12:20, 12:20]).all(axis=(3, 4, 5)))
                found += [(kind, n, dy, dx) for n, dy, dx in zip(*near) if (w[n, dy, dx] == image).all()]
            assert found, "an augmented image must be a 32x32 window of the padded record, possibly mirrored"
            kinds_and_records = {(kind, int(n)) for kind, n, _, _ in found}
            assert any(written["train_labels"][n] == label for _, n in kinds_and_records)
            offsets.update((kind, int(dy), int(dx)) for kind, _, dy, dx in found)
    assert len(offsets) > 2, "crops must vary in position and flip"


# ------------------------------------------------------------------------------------------------------ sharding
def test_two_test_shards_cover_every_test_record_once(cifar):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, eval_batch_size=3)
    seen = []
    for shard_id in range(2):
        out = batches(data.test_dataset(num_shards=2, shard_id=shard_id))
        seen += [record_index(img, written["test_images"]) for b in out for img in to_uint8_hwc(b[0])]
    assert sorted(seen) == list(range(TEST_RECORDS))


def test_two_validation_shards_cover_every_validation_record(cifar):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, eval_batch_size=3, val_fraction=0.125)  # 5 records: one repeated
    expected = expected_validation(written["train_labels"], 0.125, 0)
    seen = []
    for shard_id in range(2):
        out = batches(data.eval_dataset(num_shards=2, shard_id=shard_id))
        shard = [record_index(img, written["train_images"]) for b in out for img in to_uint8_hwc(b[0])]
        assert len(shard) == 3
        seen += shard
    assert set(seen) == set(expected.tolist()) and len(seen) == 6


def test_two_train_shards_cover_every_train_record_once_per_epoch(cifar, seed):
    root, written = cifar
    data = Cifar10Data(root, image_size=32, batch_size=4, augment=False, val_fraction=0.2)
    train = sorted(set(range(40)) - set(expected_validation(written["train_labels"], 0.2, 0).tolist()))
    seen = []
    for shard_id in range(2):
        out = batches(data.train_dataset(num_shards=2, shard_id=shard_id))
        assert len(out) == 4  # 32 training records, 16 per shard
        seen += [record_index(img, written["train_images"]) for b in out for img in to_uint8_hwc(b[0])]
    assert sorted(seen) == train


def test_shard_arguments_are_validated(cifar):
    data = Cifar10Data(cifar[0])
    with pytest.raises(ConfigError, match=r"shard_id must be in \[0, num_shards - 1\] = \[0, 1\]; got 2"):
        data.eval_dataset(num_shards=2, shard_id=2)
    with pytest.raises(ConfigError, match="num_shards must be an int >= 1; got 0"):
        data.train_dataset(num_shards=0)


# --------------------------------------------------------------------------- the official size: Cifar10Dataset
def native_then_ours(data, split: str, monkeypatch):
    """The batches of `split` read by MindSpore's Cifar10Dataset (the keyword arguments it got), then checked
    equal to those of our NumPy reader."""
    calls = []
    real = ds.Cifar10Dataset
    monkeypatch.setattr(cifar10_module.ds, "Cifar10Dataset", lambda *a, **k: calls.append(k) or real(*a, **k))
    native = batches(getattr(data, split)())
    monkeypatch.setattr(Cifar10Data, "_native_readable", lambda *a: False)
    ours = batches(getattr(data, split)())
    assert len(calls) == 1 and len(ours) == len(native)
    for (a, la), (b, lb) in zip(native, ours):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    return native, calls[0]


@pytest.mark.integration  # 10,000-record files through mindspore.dataset: seconds
def test_official_size_files_read_through_cifar10dataset_match_numpy(tmp_path, monkeypatch):
    """10,000-record files go through MindSpore's C++ reader; it must agree with the arithmetic and our reader."""
    written = write_cifar10(str(tmp_path), train_per_file=1, test_records=10000, seed=2)
    data = Cifar10Data(str(tmp_path), image_size=32, eval_batch_size=2500)
    native, call = native_then_ours(data, "test_dataset", monkeypatch)
    assert len(native) == 4  # 10,000 records in batches of 2,500
    assert call["usage"] == "test" and isinstance(call["sampler"], ds.SequentialSampler)
    for i, (images, labels) in enumerate(native):
        part = slice(2500 * i, 2500 * (i + 1))
        np.testing.assert_allclose(images, normalised_chw(written["test_images"][part]), rtol=0, atol=1e-5)
        np.testing.assert_array_equal(labels, written["test_labels"][part])


# ------------------------------------------------------------------------------------------------------- prepare
def test_prepare_missing_folder_names_path_and_the_fix(tmp_path):
    data = Cifar10Data(str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as err:
        data.prepare()
    message = str(err.value)
    assert os.path.join(str(tmp_path / "nowhere"), "cifar-10-batches-bin") in message
    assert "does not exist" in message and "data.download=true" in message and "data.root=" in message


def test_prepare_root_pointing_at_the_batches_folder_suggests_its_parent(tmp_path):
    write_cifar10(str(tmp_path))
    with pytest.raises(DataError, match=r"probably data\.root=" + str(tmp_path) + r"\."):
        Cifar10Data(str(tmp_path / "cifar-10-batches-bin")).prepare()


def test_prepare_missing_batch_file_is_named(tmp_path):
    write_cifar10(str(tmp_path))
    missing = tmp_path / "cifar-10-batches-bin" / "data_batch_4.bin"
    missing.unlink()
    with pytest.raises(DataError) as err:
        Cifar10Data(str(tmp_path)).prepare()
    assert f"{missing} is missing" in str(err.value)
    assert "data_batch_1.bin" not in str(err.value).split("Fix:")[0]  # only the broken file is listed


def test_prepare_size_not_a_multiple_of_the_record_is_corrupt(tmp_path):
    write_cifar10(str(tmp_path), train_per_file=2)
    bad = tmp_path / "cifar-10-batches-bin" / "data_batch_3.bin"
    with open(bad, "ab") as f:
        f.write(b"\0" * 5)
    with pytest.raises(DataError) as err:
        Cifar10Data(str(tmp_path)).prepare()
    message = str(err.value)
    assert str(bad) in message and f"{2 * RECORD_BYTES + 5:,} bytes" in message and "3073-byte record" in message


def test_prepare_empty_file_is_corrupt(tmp_path):
    write_cifar10(str(tmp_path))
    empty = tmp_path / "cifar-10-batches-bin" / "test_batch.bin"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=f"{empty} is corrupt: its size is 0 bytes"):
        Cifar10Data(str(tmp_path)).prepare()


@pytest.mark.parametrize("record", [1, 3])  # any record, not only the first, middle and last
def test_prepare_label_out_of_range_is_corrupt(tmp_path, record):
    write_cifar10(str(tmp_path), train_per_file=4)
    bad = tmp_path / "cifar-10-batches-bin" / "data_batch_2.bin"
    raw = bytearray(bad.read_bytes())
    raw[record * RECORD_BYTES] = 42  # that record's label byte
    bad.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=f"{bad} is corrupt: record {record} has label 42"):
        Cifar10Data(str(tmp_path)).prepare()


def test_datasets_check_the_files_when_prepare_was_not_called(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        Cifar10Data(str(tmp_path)).train_dataset()


def test_batch_larger_than_a_shard_is_refused_instead_of_an_empty_epoch(cifar):
    with pytest.raises(ConfigError, match="batch_size=32.*18 per shard"):
        Cifar10Data(cifar[0], batch_size=32).train_dataset(num_shards=2, shard_id=0)


# ------------------------------------------------------------------------------------------ constructor arguments
@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be an int >= 1; got 0"),
    ({"batch_size": 2.0}, "batch_size must be an int >= 1; got 2.0"),
    ({"eval_batch_size": 0}, "eval_batch_size must be an int >= 1; got 0"),
    ({"image_size": 4}, "image_size must be an int >= 8; got 4"),
    ({"image_size": True}, "image_size must be an int >= 8; got True"),
    ({"num_parallel_workers": 0}, "num_parallel_workers must be an int >= 1; got 0"),
    ({"augment": "false"}, "augment must be true or false; got 'false'"),
    ({"download": 1}, "download must be true or false; got 1"),
    ({"md5": "abc"}, "md5 must be 32 hexadecimal digits or null; got 'abc'"),
    ({"url": ""}, "url must be a non-empty string"),
    ({"root": ""}, "root must be a path"),
    ({"val_fraction": 0}, "val_fraction must be a number in (0, 1)"),
    ({"val_fraction": 1.0}, "val_fraction must be a number in (0, 1)"),
    ({"val_fraction": True}, "val_fraction must be a number in (0, 1)"),
    ({"split_seed": -1}, "split_seed must be an int >= 0; got -1"),
])
def test_constructor_arguments_are_validated(kwargs, message):
    arguments = {"root": "/data", **kwargs}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Cifar10Data(**arguments)


def test_protocol_attributes_and_defaults():
    data = Cifar10Data("relative/dir")
    assert data.num_classes == 10 and data.image_channels == 3
    assert data.eval_batch_size == data.batch_size == 32 and data.image_size == 224
    assert data.root == os.path.abspath("relative/dir") and data.download is False
    assert data.url == "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
    assert data.md5 == "c32a1d4ab5d03f1284b67883e8d87530"


@pytest.mark.integration  # 10,000-record files through mindspore.dataset: seconds
def test_official_size_training_files_give_the_same_validation_through_cifar10dataset(tmp_path, monkeypatch):
    """The validation subset read by MindSpore's C++ reader (a SubsetSampler over the five files) is the same records,
    in the same order, as the documented rule says and our NumPy reader gives: 500 per class."""
    written = write_cifar10(str(tmp_path), train_per_file=10000, test_records=1, seed=4)
    data = Cifar10Data(str(tmp_path), image_size=32, eval_batch_size=2500)
    native, call = native_then_ours(data, "eval_dataset", monkeypatch)
    assert call["usage"] == "train"
    expected = expected_validation(written["train_labels"], 0.1, 0)
    assert np.bincount(written["train_labels"][expected], minlength=10).tolist() == [500] * 10
    labels = np.concatenate([b[1] for b in native])
    np.testing.assert_array_equal(labels, written["train_labels"][expected])
    np.testing.assert_allclose(native[1][0], normalised_chw(written["train_images"][expected[2500:5000]]),
                               rtol=0, atol=1e-5)


def test_random_crops_and_flips_do_not_depend_on_the_worker_count(tmp_path):
    """data.num_parallel_workers may change on a resume (DATA_KEYS_FREE): the random ops run in one thread, so 1
    and 2 workers draw the same crops and flips. Mutation caught: the random ops mapped with num_parallel_workers
    threads (MindSpore gives each its own stream: red)."""
    write_cifar10(str(tmp_path), train_per_file=10, test_records=8, seed=5)
    images = {}
    for workers in (1, 2):
        ds.config.set_seed(5)
        data = Cifar10Data(str(tmp_path), image_size=32, batch_size=8, num_parallel_workers=workers)
        images[workers] = [b["image"] for b in data.train_dataset().create_dict_iterator(output_numpy=True,
                                                                                         num_epochs=1)]
    assert all(np.array_equal(a, b) for a, b in zip(images[1], images[2]))


def test_more_workers_than_cpus_run_on_the_cpus_there_are(tmp_path):
    """MindSpore raises a ValueError (a traceback) for more threads than CPUs. Mutation caught: _pipeline using
    num_parallel_workers as given (red)."""
    write_cifar10(str(tmp_path), train_per_file=10, test_records=8, seed=5)
    data = Cifar10Data(str(tmp_path), image_size=32, batch_size=8, num_parallel_workers=(os.cpu_count() or 1) + 3)
    assert sum(len(b["label"]) for b in data.train_dataset().create_dict_iterator(output_numpy=True, num_epochs=1)) \
        == 40
