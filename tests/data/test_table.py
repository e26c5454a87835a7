"""data=table: a CSV (or Parquet) trains through the app; the encoding is checked against NumPy on the training
split; missing values are refused naming column and row unless data.fill; prediction applies the stored
statistics of the training split, without the training file."""
import json
import sys

import numpy as np
import pytest

from tests.common.tables import COLOURS, rows, write_csv
from tests.common.transcripts import run_in_process
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.data.table import TableData
from trainkit.errors import ConfigError, DataError
from trainkit.rundir.data_state import load_data_state


def expected_features(table, train_rows, fill=None):
    """NumPy: age and height standardised with the training rows' mean and std (numpy.std, ddof 0), the colour
    one-hot over the training rows' colours in sorted order."""
    age = np.array([r[0] for r in table], float)
    height = np.array([np.nan if r[2] == "" else r[2] for r in table], float)
    if fill == "median":
        height[np.isnan(height)] = np.nanmedian(height[train_rows])
    columns = []
    for values in (age,):
        columns.append(((values - values[train_rows].mean()) / values[train_rows].std())[:, None])
    colours = sorted({table[r][1] for r in train_rows})
    columns.append(np.array([[float(r[1] == c) for c in colours] for r in table]))
    columns.append(((height - height[train_rows].mean()) / height[train_rows].std())[:, None])
    return np.concatenate(columns, axis=1)


def test_a_csv_trains_through_the_app_and_its_statistics_are_stored(graph_mode, tmp_path):
    """Mutation caught: statistics fitted on every row instead of the training split (the features differ: red)."""
    table = rows()
    path = write_csv(tmp_path / "animals.csv", table)
    result = train(compose_config(["data=table", f"data.path={path}", "data.target=species", "data.batch_size=8",
                                   "model=mlp", "model.hidden_sizes=[8]", "trainer.epochs=1", "logger=quiet",
                                   "trainer.test=true", f"run_dir={tmp_path / 'run'}"]))
    data = result.data
    assert data.class_names == ["ant", "bee"] and data.statistics["task"] == "classification"
    assert data.in_features == 5 and result.metrics["optimizer_steps"] == len(data.split_arrays("train")[1]) // 8
    stored = json.loads((tmp_path / "run" / "data_state.json").read_text())
    assert stored == data.statistics == load_data_state(tmp_path / "run" / "checkpoints" / "best.ckpt")
    # NumPy on the same split: the training rows are those whose target and features the module kept
    labels = np.array([r[3] == "bee" for r in table], int)
    train_rows = train_rows_of(data, table)
    features = expected_features(table, train_rows)
    np.testing.assert_allclose(data.split_arrays("train")[0], features[train_rows], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(data.split_arrays("train")[1], labels[train_rows])
    assert stored["numeric"]["age"]["mean"] == pytest.approx(np.mean([table[r][0] for r in train_rows]))


def train_rows_of(data, table):
    """The table rows of the training split: 20 % test and 10 % validation per class by split_seed 0 (DigitsData's
    rule), recomputed here with NumPy."""
    labels = np.array([r[3] == "bee" for r in table], int)
    rng = np.random.default_rng(0)
    train = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        test = min(len(members) - 1, max(1, round(0.2 * len(members))))
        val = min(len(members) - test - 1, max(1, round(0.1 * len(members))))
        train.append(members[test + val:])
    return np.sort(np.concatenate(train))


def test_prediction_applies_the_training_statistics_without_the_training_file(tmp_path):
    table = rows()
    path = write_csv(tmp_path / "animals.csv", table)
    trained = TableData(path, "species")
    trained.prepare()
    state = json.loads(json.dumps(trained.state_dict()))  # as the run stores it
    path.unlink()
    new = write_csv(tmp_path / "new.csv", [[30, "red", 180.0], [45, "purple", 160.5], [50, "blue", "abc"]],
                    header=("age", "colour", "height"))
    fresh = TableData(path, "species")
    fresh.load_state_dict(state)
    predicted = list(fresh.predict_samples([str(new)]))
    age = np.array([table[r][0] for r in train_rows_of(trained, table)], float)
    height = np.array([table[r][2] for r in train_rows_of(trained, table)], float)
    expected = [(30 - age.mean()) / age.std(), 0, 0, 1, (180 - height.mean()) / height.std()]
    assert predicted[0][0] == "0" and predicted[0][2] is None
    np.testing.assert_allclose(predicted[0][1], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predicted[1][1][1:4], [0, 0, 0])  # a colour training never saw: all zeros
    assert predicted[2] == ("2", None, f"{new}: column 'height' holds 'abc' in row 2, not a number")
    assert list(fresh.predict_samples([str(tmp_path / "gone.csv")])) == [
        (str(tmp_path / "gone.csv"), None, f"{tmp_path / 'gone.csv'} does not exist")]


def test_a_missing_value_is_refused_naming_column_and_row_unless_filled(tmp_path, monkeypatch):
    """Mutation caught: encode() filling silently without data.fill (no refusal: red)."""
    table = rows()
    table[7][2] = ""
    path = write_csv(tmp_path / "gaps.csv", table)
    monkeypatch.chdir(tmp_path)
    printed = run_in_process(["python", "-m", "trainkit", "data=table", f"data.path={path}", "data.target=species",
                              "model=mlp", f"hydra.run.dir={tmp_path / 'run'}"])
    assert printed.status == 2 and printed.stderr.count("\n") == 1, printed.stderr
    assert f"trainkit: error: {path}: column 'height' has no value in row 7: fill it in, or set data.fill (mean, " \
           "median, most_frequent, zero)" in printed.stderr
    filled = TableData(path, "species", fill="median")
    filled.prepare()
    train_rows = train_rows_of(filled, table)
    np.testing.assert_allclose(filled.split_arrays("train")[0], expected_features(table, train_rows, "median")[
        train_rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change, message", [
    (lambda t: t[3].__setitem__(3, ""), "column 'species' (the target) has no value in row 3: a target is never "
                                        "filled"),
    (lambda t: t[5].__setitem__(0, "forty"), "column 'age' holds text ('forty' in row 5) among numbers: fix the "
                                             "value, or list the column in data.categorical"),
])
def test_bad_values_are_one_line_naming_column_and_row(tmp_path, change, message):
    table = rows()
    change(table)
    path = write_csv(tmp_path / "bad.csv", table)
    with pytest.raises(DataError) as error:
        TableData(path, "species").prepare()
    assert f"{path}: {message}" in str(error.value) and "\n" not in str(error.value)


def test_config_errors_name_the_key(tmp_path):
    path = write_csv(tmp_path / "t.csv", rows())
    with pytest.raises(ConfigError, match=r"data.target=kind is not a column of .*t.csv: its columns are age, "
                                          r"colour, height, species"):
        TableData(path, "kind").prepare()
    with pytest.raises(ConfigError, match="data.features names 'weight', which is not a feature column"):
        TableData(path, "species", features=["age", "weight"]).prepare()
    with pytest.raises(ConfigError, match="path must be a .csv or .parquet file; got 't.xlsx'"):
        TableData("t.xlsx", "species")
    with pytest.raises(ConfigError, match="fill must be null"):
        TableData(path, "species", fill="mode")


def test_the_task_follows_the_target_or_the_config(tmp_path):
    table = [[i, COLOURS[i % 3], float(i) * 1.5, i % 4] for i in range(40)]
    path = write_csv(tmp_path / "numbers.csv", table, header=("a", "colour", "b", "y"))
    whole = TableData(path, "y")
    whole.prepare()
    assert whole.statistics["task"] == "classification" and whole.class_names == ["0", "1", "2", "3"]
    values = TableData(path, "b", features=["a", "colour"])  # 40 distinct values: more than max_classes
    values.prepare()
    assert values.statistics["task"] == "regression" and values.class_names is None and values.out_features == 1
    assert values.split_arrays("train")[1].dtype == np.float32 and values.split_arrays("train")[1].shape[1] == 1
    forced = TableData(path, "y", task="regression")
    forced.prepare()
    assert forced.num_classes is None


def test_parquet_reads_as_the_csv_does_and_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = rows()
    csv_data = TableData(write_csv(tmp_path / "t.csv", table), "species")
    csv_data.prepare()
    columns = {name: [r[i] for r in table] for i, name in enumerate(("age", "colour", "height", "species"))}
    pq.write_table(pyarrow.table(columns), tmp_path / "t.parquet")
    parquet_data = TableData(tmp_path / "t.parquet", "species")
    parquet_data.prepare()
    for split in ("train", "val", "test"):
        for a, b in zip(csv_data.split_arrays(split), parquet_data.split_arrays(split)):
            np.testing.assert_array_equal(a, b)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"t.parquet: reading Parquet needs pyarrow, which is not installed: pip "
                                        r"install 'trainkit\[table\]'"):
        TableData(tmp_path / "t.parquet", "species").prepare()

