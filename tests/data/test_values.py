"""Bad data values stop before compiling: ``trainkit.data.check_values`` names the column, the first bad sample and
what is valid, for every data module trainkit ships and the example project's ``.npz`` module."""
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.data import check_values, num_classes_of
from trainkit.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)
N = 50


def images():
    return RNG.normal(size=(N, 1, 4, 4)).astype(np.float32)


def labels():
    return np.arange(N) % 3


def planted(value):
    """Images with `value` at a random pixel of a random sample; returns them and that sample's index."""
    array, index = images(), int(RNG.integers(N))
    array[index, 0, int(RNG.integers(4)), int(RNG.integers(4))] = value
    return array, index


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_feature_is_named_with_its_sample(value):
    array, index = planted(value)
    with pytest.raises(DataError) as error:
        check_values("f.npz", {"image": array}, {"label": labels()}, num_classes=3)
    assert str(error.value).startswith(f"f.npz: column 'image', sample {index} holds {value}")
    assert "features must be finite" in str(error.value)


@pytest.mark.parametrize("bad", [3, 10, -1])
def test_a_label_outside_the_classes_is_named_with_its_sample(bad):
    target, index = labels(), int(RNG.integers(N))
    target[index] = bad
    with pytest.raises(DataError, match=rf"^f.npz: column 'label', sample {index} is {bad} .*integers in \[0, 3\)"):
        check_values("f.npz", {"image": images()}, {"label": target}, num_classes=3)


def test_float_labels_must_be_whole_numbers_and_are_not_rounded():
    target = labels().astype(np.float32)
    check_values("f.npz", {"image": images()}, {"label": target}, num_classes=3)  # 0.0, 1.0, 2.0: whole numbers
    index = int(RNG.integers(N))
    target[index] = 1.5
    with pytest.raises(DataError, match=rf"sample {index} is 1.5, not a whole number"):
        check_values("f.npz", {"image": images()}, {"label": target}, num_classes=3)


def test_empty_or_mismatched_columns_and_regression_targets():
    with pytest.raises(DataError, match="holds no samples"):
        check_values("f.npz", {"image": images()[:0]}, {"label": labels()[:0]}, num_classes=3)
    with pytest.raises(DataError, match="different numbers of samples \\('image' 50, 'label' 49\\)"):
        check_values("f.npz", {"image": images()}, {"label": labels()[:-1]}, num_classes=3)
    target = RNG.normal(size=(N, 1)).astype(np.float32)
    check_values("t", {"x": images()}, {"y": target})  # regression: any finite value
    target[4, 0] = np.nan
    with pytest.raises(DataError, match="column 'y', sample 4 holds nan.*regression targets must be finite"):
        check_values("t", {"x": images()}, {"y": target})
    with pytest.raises(DataError, match="t, batch 7: column 'y', sample 4"):
        check_values("t", {"x": images()}, {"y": target}, batch=7)


def test_a_clean_100_mb_array_passes():
    check_values("big", {"x": np.ones((25_000_000,), np.float32)}, {"y": np.zeros(25_000_000, np.int8)}, 2)


def test_num_classes_from_labels_refuses_a_gap():
    assert num_classes_of("f", "y", labels()) == 3
    target = labels()
    target[17] = 10
    with pytest.raises(DataError, match="sample 17 is 10 but no sample has label 3..9"):
        num_classes_of("f", "y", target)


def test_shipped_scikit_learn_modules_check_their_values(monkeypatch):
    import sklearn.datasets

    from trainkit.data.tabular import SklearnTabularData

    features, target = sklearn.datasets.load_wine(return_X_y=True)
    features[33, 5] = np.nan
    monkeypatch.setattr(sklearn.datasets, "load_wine", lambda return_X_y: (features, target))
    with pytest.raises(DataError, match="load_wine: column 'features', sample 33 holds nan"):
        SklearnTabularData("wine").prepare()


# ------------------------------------------------------------------- the example project, end to end
@pytest.fixture(scope="module")
def example():
    folder = REPO / "examples" / "my_project"
    sys.path.insert(0, str(folder))
    from my_project.make_data import make_images

    yield folder, make_images(20)
    sys.path.remove(str(folder))
    for name in [name for name in sys.modules if name == "my_project" or name.startswith("my_project.")]:
        del sys.modules[name]


def run_example(folder, path, run_dir):
    return train(compose_config([f"hydra.searchpath=[file://{folder / 'conf'}]", "recipe=lines",
                                 f"data.path={path}", "logger.progress=off", f"run_dir={run_dir}"]))


@pytest.mark.parametrize("case, message", [
    ("nan", "column 'images', sample 7 holds nan"),
    ("inf", "column 'images', sample 7 holds inf"),
    ("label_10", "column 'labels', sample 7 is 10 but no sample has label 3..9"),
    ("label_minus_1", "column 'labels', sample 7 is -1"),
    ("float_labels", "column 'labels', sample 0 is 0.5, not a whole number"),
    ("empty", "holds no samples"),
    ("mismatched", "different numbers of samples ('images' 60, 'labels' 59)"),
    ("not_npz", "is not a NumPy .npz file"),
])
def test_the_example_module_refuses_bad_values_before_building_anything(example, tmp_path, monkeypatch, case,
                                                                         message):
    folder, (good_images, good_labels) = example
    data, target = good_images.copy(), good_labels.copy()
    if case in ("nan", "inf"):
        data[7, 0, 2, 5] = float(case)
    elif case == "label_10":
        target[7] = 10
    elif case == "label_minus_1":
        target[7] = -1
    elif case == "float_labels":
        target = target + 0.5
    elif case == "empty":
        data, target = data[:0], target[:0]
    elif case == "mismatched":
        target = target[:-1]
    path = tmp_path / "bad.npz"
    if case == "not_npz":
        path.write_text("images,labels\n1,2\n")
    else:
        np.savez(path, images=data, labels=target)
    monkeypatch.setattr(ms.train.Model, "train", lambda *args, **kwargs: pytest.fail("Model.train was reached"))
    with pytest.raises(DataError) as error:
        run_example(folder, path, tmp_path / "run")
    assert str(error.value).startswith(str(path)) and message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run" / ".hydra").exists()


def test_the_fit_check_refuses_a_label_the_model_has_no_output_for(example, tmp_path, monkeypatch):
    """A data module that checks nothing and says 2 classes, with labels 0..2: the fit check sees the label 2."""
    import my_project.data

    folder, (data, target) = example
    path = tmp_path / "lines.npz"
    np.savez(path, images=data, labels=target)
    monkeypatch.setattr(my_project.data, "check_values", lambda *args, **kwargs: None)
    monkeypatch.setattr(ms.train.Model, "train", lambda *args, **kwargs: pytest.fail("Model.train was reached"))
    with pytest.raises(ConfigError, match=r"but the model has 2 outputs: class labels must be integers in \[0, 2\)"):
        train(compose_config([f"hydra.searchpath=[file://{folder / 'conf'}]", "recipe=lines", f"data.path={path}",
                              "data.num_classes=2", "logger.progress=off", f"run_dir={tmp_path / 'run'}"]))


# ------------------------------------------------------------------- a streaming source, batch by batch
def streaming(run_dir, *extra):
    return compose_config(["recipe=wine_mlp", "data._target_=tests.common.streaming.StreamingRows", "data.batch_size=8",
                           "trainer.epochs=2", "trainer.eval_interval=0",
                           "logger.progress=off", f"run_dir={run_dir}", *extra])


@pytest.mark.parametrize("row, bad, message", [
    (21, "feature", "StreamingRows.train_dataset(), batch 3: column 'features', sample 5 holds nan"),
    (42, "7", "StreamingRows.train_dataset(), batch 6: column 'target', sample 2 is 7 (1 of 8 out of range): "
              "class labels must be integers in [0, 3)"),
])
def test_a_streaming_source_is_checked_batch_by_batch_in_the_first_epoch(tmp_path, row, bad, message):
    with pytest.raises(DataError) as error:
        train(streaming(tmp_path, f"+data.bad_row={row}", f"+data.bad={bad}"))
    assert str(error.value).startswith(message), str(error.value)
    assert "\n" not in str(error.value)


def test_a_streaming_source_without_num_classes_is_checked_against_the_models_outputs(tmp_path):
    """Label 7 for a 3-output model, the module giving no num_classes: one line naming the batch and the sample,
    before the step that would crash (RuntimeError after compiling, exit 1). Mutation caught: not passing
    check_fit's output width to the first-epoch check (num_classes stays None: the label went unchecked)."""
    row, batch_size, outputs = 42, 8, 3  # the wine model's width is out_features=3
    with pytest.raises(DataError) as error:
        train(streaming(tmp_path, "+data.bad_row=42", "+data.bad=7", "+data.says_classes=false"))
    batch, sample = row // batch_size + 1, row % batch_size
    assert str(error.value) == (
        f"StreamingRows.train_dataset(), batch {batch}: column 'target', sample {sample} is 7 (1 of {batch_size} out "
        f"of range): class labels must be integers in [0, {outputs}) (the model has {outputs} outputs; the data "
        "module gives no num_classes)")


def test_a_clean_streaming_source_trains(tmp_path):
    result = train(streaming(tmp_path))
    assert result.metrics["optimizer_steps"] == 16
