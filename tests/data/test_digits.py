"""DigitsData: split sizes and determinism, normalisation against NumPy, shapes, the missing-sklearn message."""
import sys

import numpy as np
import pytest

from trainkit.data.digits import DigitsData
from trainkit.errors import ConfigError, DataError

sklearn_datasets = pytest.importorskip("sklearn.datasets")


def batches(dataset):
    return list(dataset.create_tuple_iterator(output_numpy=True, num_epochs=1))


@pytest.fixture(scope="module")
def digits():
    loaded = sklearn_datasets.load_digits()
    return loaded.images.astype(np.float64), loaded.target


def eval_arrays(data, **kwargs):
    out = batches(data.eval_dataset(**kwargs))
    return np.concatenate([b[0] for b in out]), np.concatenate([b[1] for b in out])


def test_split_sizes_disjoint_stratified_and_deterministic(digits):
    _, labels = digits
    data = DigitsData(test_fraction=0.2, val_fraction=0.1, split_seed=3)
    train, val, test = data.split(labels)
    assert len(train) + len(val) + len(test) == 1797
    assert not set(train) & set(test) and not set(val) & set(test) and not set(train) & set(val)
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(1797))
    for c in range(10):  # every class held out in proportion, in both held-out sets
        assert abs(np.sum(labels[test] == c) - 0.2 * np.sum(labels == c)) <= 0.5
        assert abs(np.sum(labels[val] == c) - 0.1 * np.sum(labels == c)) <= 0.5
    again, _, _ = DigitsData(test_fraction=0.2, split_seed=3).split(labels)
    other, _, _ = DigitsData(test_fraction=0.2, split_seed=4).split(labels)
    np.testing.assert_array_equal(train, again)
    assert not np.array_equal(train, other)
    _, _, same_test = DigitsData(test_fraction=0.2, val_fraction=0.3, split_seed=3).split(labels)
    np.testing.assert_array_equal(same_test, test)  # the test images do not move with the validation share


def test_the_test_set_is_each_class_s_first_share_and_disjoint_from_what_the_run_sees(digits):
    images, labels = digits
    data = DigitsData(eval_batch_size=1000, split_seed=0)
    rng = np.random.default_rng(0)  # the documented rule, recomputed: per class, a permutation's first 20 %
    expected = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[
        :round(0.2 * np.sum(labels == c))] for c in range(10)]))
    (test_images, test_labels), = batches(data.test_dataset())
    scaled = images / 16.0
    train, val, _ = data.split(labels)
    mean, std = scaled[train].mean(), scaled[train].std()
    np.testing.assert_allclose(test_images[:, 0], (scaled[expected] - mean) / std, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(test_labels, labels[expected])
    (val_images, _), = batches(data.eval_dataset())
    seen = np.concatenate([b[0] for b in batches(DigitsData(batch_size=1).train_dataset())] + [val_images])
    seen_rows = {row.tobytes() for row in seen.reshape(len(seen), -1)}
    test_rows = {row.tobytes() for row in test_images.reshape(len(test_images), -1)}
    assert len(seen_rows) == len(train) + len(val) and len(test_rows) == len(expected)  # no two images alike
    assert not seen_rows & test_rows  # no test image is trained or validated on


def test_eval_images_are_normalised_with_the_train_statistics(digits):
    images, labels = digits
    data = DigitsData(eval_batch_size=100, split_seed=1)
    data.prepare()
    train, val, _ = data.split(labels)
    scaled = images / 16.0
    mean, std = scaled[train].mean(), scaled[train].std()
    got_images, got_labels = eval_arrays(data)  # the validation split
    assert got_images.dtype == np.float32 and got_labels.dtype == np.int32
    assert got_images.shape == (len(val), 1, 8, 8)
    np.testing.assert_allclose(got_images[:, 0], (scaled[val] - mean) / std, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got_labels, labels[val])
    assert data.mean == pytest.approx(mean) and data.std == pytest.approx(std)


def test_train_batches_shapes_drop_remainder_and_shuffle(digits):
    _, labels = digits
    data = DigitsData(batch_size=100)
    out = batches(data.train_dataset())
    train, _, _ = data.split(labels)
    assert len(out) == len(train) // 100
    assert all(b[0].shape == (100, 1, 8, 8) and b[0].dtype == np.float32 and b[1].dtype == np.int32 for b in out)
    seen = np.concatenate([b[1] for b in out])
    assert not np.array_equal(seen, labels[train][:len(seen)]), "the training set must be shuffled"


def test_image_size_upscales(digits):
    (images, labels), *_ = batches(DigitsData(eval_batch_size=4, image_size=16).eval_dataset())
    assert images.shape == (4, 1, 16, 16) and np.isfinite(images).all()


def test_two_eval_shards_cover_the_test_split_once():
    data = DigitsData(eval_batch_size=50, test_fraction=0.2)
    whole, _ = eval_arrays(data)
    parts = [eval_arrays(data, num_shards=2, shard_id=k)[0] for k in range(2)]
    # shard k holds rows k, k + 2, ... (an odd count is padded with a repeated row at the end of one shard)
    for k in range(2):
        np.testing.assert_array_equal(parts[k][: len(whole[k::2])], whole[k::2])
    assert len(parts[0]) == len(parts[1]) == (len(whole) + 1) // 2


def test_the_bundled_file_read_without_importing_sklearn_is_load_digits(digits):
    code = ("import sys; from trainkit.data.digits import load_digits_arrays; images, labels = load_digits_arrays(); "
            "print('sklearn' in sys.modules)")
    import subprocess
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"  # the 1.2 s import is what reading the file directly saves
    from trainkit.data.digits import load_digits_arrays

    images, labels = load_digits_arrays()
    np.testing.assert_array_equal(images, digits[0])
    np.testing.assert_array_equal(labels, digits[1])


def test_without_the_bundled_file_load_digits_gives_the_arrays(digits, monkeypatch, tmp_path):
    import importlib.util

    from trainkit.data import digits as module

    real = importlib.util.find_spec("sklearn")
    fake = importlib.util.spec_from_file_location("sklearn", tmp_path / "__init__.py",
                                                  submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: fake if name == "sklearn" else real)
    images, labels = module.load_digits_arrays()
    np.testing.assert_array_equal(images, digits[0])
    np.testing.assert_array_equal(labels, digits[1])


def test_missing_sklearn_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(DataError, match=r"pip install 'trainkit\[digits\]' \(or pip install scikit-learn\)"):
        DigitsData().prepare()


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be an int >= 1; got 0"),
    ({"test_fraction": 1.0}, r"test_fraction must be a number in \(0, 1\); got 1.0"),
    ({"test_fraction": "0.2"}, r"test_fraction must be a number in \(0, 1\); got '0.2'"),
    ({"split_seed": -1}, "split_seed must be an int >= 0; got -1"),
    ({"image_size": 7}, "image_size must be an int >= 8; got 7"),
])
def test_constructor_arguments_are_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DigitsData(**kwargs)


def test_batch_larger_than_the_training_split_is_refused():
    with pytest.raises(ConfigError, match="batch_size=5000"):
        DigitsData(batch_size=5000).train_dataset()


def test_protocol_attributes():
    data = DigitsData()
    assert data.num_classes == 10 and data.image_channels == 1 and data.eval_batch_size == 32
