"""python -m trainkit.predict on a run trained through the app: rows as the network's own logits say, bad input."""
import csv

import numpy as np

from tests.common.trained_digits import network_logits, val_digits
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.tools.predict import main

TOP_K = 3


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def expected_top_k(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    order = np.argsort(-probabilities, axis=1)[:, :TOP_K]
    return order, np.take_along_axis(probabilities, order, axis=1)


def check_rows(rows, ids, logits):
    order, probabilities = expected_top_k(logits)
    assert [row[0] for row in rows] == ids
    for row, classes, chances in zip(rows, order, probabilities):
        assert [int(row[i]) for i in (1, 3, 5)] == classes.tolist(), row
        np.testing.assert_allclose([float(row[i]) for i in (2, 4, 6)], chances, atol=2e-6)


def test_rows_are_the_networks_top_k_on_the_eval_transforms(digits_run, tmp_path, capsys):
    """Rows: the softmax (NumPy) of the network's logits on the evaluation pipeline's images of the same digits.

    Mutations caught: the normalisation left out of DigitsData.predict_samples (classes and probabilities move);
    probabilities sorted ascending; the EMA weights ignored for --weights-of ema; a batch's rows paired with the
    next batch's inputs (--batch-size 7 splits the 30 digits unevenly)."""
    raw, fed = val_digits(30)
    np.save(tmp_path / "digits.npy", raw[:25])
    with open(tmp_path / "more.csv", "w") as handle:
        handle.write(",".join(f"pixel{i}" for i in range(64)) + "\n")
        handle.writelines(",".join(f"{v:g}" for v in row) + "\n" for row in raw[25:])
    inputs = [str(tmp_path / "digits.npy"), str(tmp_path / "more.csv")]
    ids = [f"{tmp_path}/digits.npy:{i}" for i in range(25)] + [f"{tmp_path}/more.csv:{i}" for i in range(5)]
    for weights in ("live", "ema"):
        out = tmp_path / f"{weights}.csv"
        assert main([str(digits_run), *inputs, "--out", str(out), "--top-k", str(TOP_K), "--weights-of", weights,
                     "--batch-size", "7"]) == 0
        rows = read_rows(out)
        assert rows[0] == ["input", "prediction", "probability", "class_2", "probability_2", "class_3",
                           "probability_3"]
        check_rows(rows[1:], ids, network_logits(digits_run, fed, weights))
    assert "30 predictions by " in capsys.readouterr().out
    live, ema = read_rows(tmp_path / "live.csv"), read_rows(tmp_path / "ema.csv")
    assert live != ema  # the EMA of one epoch differs from the live weights


def test_an_unreadable_input_is_one_line_and_the_rest_is_predicted(digits_run, tmp_path, capsys):
    """Missing file, corrupt .npy, a table of the wrong shape: one line each, the good rows still written.

    Mutation caught: predict stopping at the first bad input (the good file's rows are missing)."""
    raw, fed = val_digits(4)
    np.save(tmp_path / "good.npy", raw)
    (tmp_path / "corrupt.npy").write_bytes(b"\x93NUMPY not really")
    np.save(tmp_path / "wide.npy", np.zeros((3, 65)))
    out = tmp_path / "out.csv"
    bad = [str(tmp_path / name) for name in ("missing.npy", "corrupt.npy", "wide.npy")]
    assert main([str(digits_run), *bad, str(tmp_path / "good.npy"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"trainkit: skipped: {bad[0]} does not exist",
                   f"trainkit: skipped: {bad[1]} cannot be read as .npy (" + err[1].split("(", 1)[1],
                   f"trainkit: skipped: {bad[2]} holds rows of shape (65,): a digit (8 x 8 pixel values 0..16, "
                   "as load_digits gives) is (8, 8) (64 values a row)"]
    check_rows(read_rows(out)[1:], [f"{tmp_path}/good.npy:{i}" for i in range(4)], network_logits(digits_run, fed))


def test_bad_output_or_no_readable_input_is_one_line_and_writes_nothing(digits_run, tmp_path, capsys):
    """Mutation caught: the CSV written in place (``temporary = output``: --force with no readable input truncates,
    then loses, the file it was to replace)."""
    np.save(tmp_path / "good.npy", np.zeros((2, 64)))
    (tmp_path / "taken.csv").write_text("mine\n")
    (tmp_path / "a_file").write_text("")
    good = str(tmp_path / "good.npy")
    cases = [([good, "--out", str(tmp_path / "taken.csv")], "taken.csv already exists: nothing was written"),
             ([good, "--out", str(tmp_path / "a_file" / "p.csv")], f"{tmp_path}/a_file is a file, not a folder"),
             ([str(tmp_path / "nothing.npy"), "--out", str(tmp_path / "p.csv")],
              "no input could be predicted (1 skipped): nothing was written"),
             ([str(tmp_path / "nothing.npy"), "--out", str(tmp_path / "taken.csv"), "--force"],
              "no input could be predicted (1 skipped): nothing was written"),
             ([good, "--out", str(tmp_path / "p.csv"), "--top-k", "0"], "--top-k and --batch-size must be at least 1")]
    for argv, message in cases:
        assert main([str(digits_run), *argv]) == 2, message
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert last.startswith("trainkit: error: ") and message in last, err
    assert (tmp_path / "taken.csv").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "good.npy", "taken.csv"]


def test_class_names_the_run_stored_name_the_classes(digits_run, tmp_path, monkeypatch, capsys):
    """load_class_names(run directory) (trainkit.rundir.class_names) names the classes; asked of the run directory
    first. Mutation caught: the names ignored (class indices written although the run stored names)."""
    import trainkit.tools.predict as predict

    names = [f"digit-{index}" for index in range(10)]
    asked = []
    monkeypatch.setattr(predict, "load_class_names", lambda source: asked.append(source) or names)
    raw, fed = val_digits(3)
    np.save(tmp_path / "d.npy", raw)
    assert main([str(digits_run), str(tmp_path / "d.npy"), "--out", str(tmp_path / "p.csv")]) == 0
    assert asked[0] == digits_run and "classes by name" in capsys.readouterr().out
    order, _ = expected_top_k(network_logits(digits_run, fed))
    rows = read_rows(tmp_path / "p.csv")[1:]
    assert [[row[1], row[3], row[5]] for row in rows] == [[names[i] for i in classes] for classes in order]


def test_a_planted_checkpoint_is_refused_by_predict_and_export(digits_run, tmp_path, capsys):
    """A stored config naming an untrusted target (evaluate's rule): one line, nothing runs, nothing is written.

    Mutation caught: load_trained trusting more than the user said (``[*trust, "pathlib"]``: the file is planted)."""
    from tests.tools.test_untrusted_configs import planted, with_config
    from trainkit.export import main as export

    victim = tmp_path / "site-packages" / "x.pth"
    victim.parent.mkdir()
    epoch_end = sorted((digits_run / "checkpoints").glob("trainkit-*.ckpt"))[-1]  # holds its config; best.ckpt not
    checkpoint = with_config(epoch_end, tmp_path / "planted.ckpt",
                             lambda config: config.__setitem__("data", planted(victim)))
    np.save(tmp_path / "d.npy", np.zeros((1, 64)))
    for tool, argv in ((main, [str(tmp_path / "d.npy"), "--out", str(tmp_path / "p.csv")]),
                       (export, [str(tmp_path / "m.onnx")])):
        assert tool([str(checkpoint), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "=pathlib.Path" in err and "not trusted" in err, err
    assert not victim.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npy", "planted.ckpt", "site-packages"]


def test_a_regression_predicts_values_from_raw_rows(tmp_path_factory, tmp_path):
    """scikit-learn's diabetes (raw features): each row's value is the network's output on the standardised row.

    Mutation caught: SklearnTabularData.predict_samples leaving the features unstandardised."""
    from trainkit.data.tabular import SklearnTabularData

    run_dir = tmp_path_factory.mktemp("diabetes") / "run"
    train(compose_config(["recipe=diabetes_regression", f"run_dir={run_dir}", "logger.progress=off",
                          "logger.tensorboard=false", "trainer.epochs=1", "trainer.eval_interval=1",
                          "trainer.test=false"]))
    data = SklearnTabularData(dataset="diabetes")
    data.prepare()
    fed = data.eval_arrays[0][:9]
    raw = fed.astype(np.float64) * data.feature_std + data.feature_mean  # the rows as load_diabetes gives them
    np.savetxt(tmp_path / "patients.csv", raw, delimiter=",")
    assert main([str(run_dir), str(tmp_path / "patients.csv"), "--out", str(tmp_path / "p.csv")]) == 0
    rows = read_rows(tmp_path / "p.csv")
    assert rows[0] == ["input", "prediction"]
    expected = network_logits(run_dir, fed).ravel()
    np.testing.assert_allclose([float(row[1]) for row in rows[1:]], expected, rtol=1e-5, atol=1e-5)


def test_classes_are_named_in_the_training_order_where_it_is_not_the_names_string_order(digits_run, tmp_path):
    """Whole-number classes 1, 2, 4, ..., 512 (as strings "1" < "128" < "16" < "2" ...): a table's class i is the
    i-th value by number, its rows' labels say so, and predict names a row's class i by that i-th name.

    Mutations caught: the names sorted as strings where predict reads them (trainkit.tools.predict.class_names), or
    where they are loaded (trainkit.rundir.class_names), or a table's classes sorted as strings (red: rows name
    the wrong class)."""
    import shutil

    from trainkit.data.table import TableData
    from trainkit.rundir.class_names import save_class_names

    values = [2 ** k for k in range(10)]
    assert sorted(map(str, values)) != [str(v) for v in values]  # the premise: string order is another order
    rng = np.random.default_rng(0)
    column = rng.permutation(np.repeat(values, 6))
    (tmp_path / "t.csv").write_text("x,y\n" + "".join(f"{v}.0,{v}\n" for v in column))
    data = TableData(path=tmp_path / "t.csv", target="y", standardize=False)
    data.prepare()
    assert data.class_names == [str(v) for v in values]
    features, labels = data.split_arrays("train")
    assert [data.class_names[label] for label in labels] == [str(int(x)) for x in features[:, 0]]

    run = tmp_path / "run"
    shutil.copytree(digits_run, run)
    save_class_names(run, data.class_names)  # what the app stores of the data module
    raw, fed = val_digits(12)
    np.save(tmp_path / "d.npy", raw)
    assert main([str(run), str(tmp_path / "d.npy"), "--out", str(tmp_path / "p.csv")]) == 0
    order, _ = expected_top_k(network_logits(run, fed))
    rows = read_rows(tmp_path / "p.csv")[1:]
    assert [[row[1], row[3], row[5]] for row in rows] == [[str(values[i]) for i in classes] for classes in order]


def test_batches_equal_the_trained_network_one_digit_at_a_time(digits_run, tmp_path):
    """30 digits in batches of 8 (the first eager, the last 6 padded to 8) give each digit's probabilities alone:
    the test's own network (MindSpore's loader) called once a digit, softmax in NumPy, within 1e-6.

    Mutation caught: the padding's rows paired with the inputs (the last batch's rows shift)."""
    raw, fed = val_digits(30)
    np.save(tmp_path / "d.npy", raw)
    assert main([str(digits_run), str(tmp_path / "d.npy"), "--out", str(tmp_path / "p.csv"), "--batch-size", "8",
                 "--top-k", "10"]) == 0
    rows = read_rows(tmp_path / "p.csv")[1:]
    got = np.zeros((30, 10))
    for index, row in enumerate(rows):
        for rank in range(10):
            got[index, int(row[1 + 2 * rank])] = float(row[2 + 2 * rank])
    logits = network_logits(digits_run, fed, one_at_a_time=True)
    shifted = logits - logits.max(axis=1, keepdims=True)
    np.testing.assert_allclose(got, np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True), atol=1e-6)


def test_a_nan_row_stops_predict_naming_file_and_row_and_skip_bad_counts_it(digits_run, tmp_path, capsys):
    """As training refuses non-finite inputs: one line, status 2, nothing written; --skip-bad: the rest predicted,
    the count in the summary line.

    Mutation caught: predict's finiteness check removed (a NaN digit gets a confident class, status 0)."""
    raw, fed = val_digits(6)
    raw = raw.astype(np.float64)
    raw[2, 5], raw[4, 0] = np.nan, np.inf
    np.savetxt(tmp_path / "new.csv", raw, delimiter=",")
    out = tmp_path / "p.csv"
    assert main([str(digits_run), str(tmp_path / "new.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"trainkit: error: {tmp_path}/new.csv, row 2 holds nan: inputs must be finite numbers, as "
                   "training's are; fix it, or pass --skip-bad to skip such inputs"]
    assert not out.exists()
    assert main([str(digits_run), str(tmp_path / "new.csv"), "--out", str(out), "--skip-bad"]) == 0
    assert "; skipped 2 input(s) holding NaN or inf (--skip-bad)" in capsys.readouterr().out
    check_rows(read_rows(out)[1:], [f"{tmp_path}/new.csv:{i}" for i in (0, 1, 3, 5)],
               network_logits(digits_run, fed[[0, 1, 3, 5]]))
