"""The rows ``python -m trainkit.predict`` reads from a table: .npy, .npz, .csv, and one line per unusable file."""
import numpy as np

from trainkit.data.predict_inputs import table_samples


def _samples(paths, shape=(2, 3)):
    return list(table_samples([str(p) for p in paths], lambda row: row * 2.0, shape, "an input"))


def test_rows_of_npy_npz_and_csv_are_read_in_order_and_prepared(tmp_path):
    """Mutation caught: ``yield ..., row, None`` (prepare not applied) and a header row taken as data."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 2, 3))
    np.save(tmp_path / "a.npy", rows)
    np.savez(tmp_path / "b.npz", features=rows[:2], labels=np.arange(2))
    lines = ["a,b,c,d,e,f"] + [",".join(repr(float(v)) for v in row.ravel()) for row in rows[2:]]
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    got = _samples([tmp_path / "a.npy", tmp_path / "b.npz", tmp_path / "c.csv"])
    ids = [item[0] for item in got]
    assert ids == [f"{tmp_path}/a.npy:{i}" for i in range(4)] + [f"{tmp_path}/b.npz:{i}" for i in range(2)] + [
        f"{tmp_path}/c.csv:{i}" for i in range(2)]
    expected = np.concatenate([rows, rows[:2], rows[2:]]) * 2.0
    np.testing.assert_allclose(np.stack([item[1] for item in got]), expected)
    assert all(item[2] is None for item in got)


def test_a_bad_file_gets_one_line_and_the_rest_goes_on(tmp_path):
    """Mutation caught: raising on the first bad file instead of yielding its line."""
    np.save(tmp_path / "good.npy", np.ones((2, 6)))  # flat rows: reshaped to (2, 3)
    np.save(tmp_path / "wide.npy", np.ones((2, 7)))
    (tmp_path / "words.csv").write_text("1,2,3,4,5,6\n1,2,x,4,5,6\n")
    (tmp_path / "ragged.csv").write_text("1,2,3,4,5,6\n1,2\n")
    got = _samples([tmp_path / "missing.npy", tmp_path / "wide.npy", tmp_path / "words.csv", tmp_path / "ragged.csv",
                    tmp_path / "good.npy"])
    errors = [item[2] for item in got if item[2] is not None]
    assert len(errors) == 4 and all("\n" not in e for e in errors)
    assert errors[0] == f"{tmp_path}/missing.npy does not exist"
    assert "(7,)" in errors[1] and "(2, 3)" in errors[1]
    assert "row 1" in errors[2] and "columns" in errors[3]
    good = [item for item in got if item[2] is None]
    assert [item[0] for item in good] == [f"{tmp_path}/good.npy:0", f"{tmp_path}/good.npy:1"]
    np.testing.assert_allclose(good[0][1], np.full((2, 3), 2.0))
