"""What a predict row holds (top-k names and probabilities, regression values) and the progress line: no network."""
import io

import numpy as np

from trainkit.tools.predict import PredictProgress, header, prediction_rows


def test_top_k_rows_name_the_classes_by_probability():
    """Mutations caught: names indexed by rank instead of class; probabilities from the logits without softmax."""
    logits = np.random.default_rng(3).normal(size=(6, 4)) * 3
    names = ["cat", "dog", "fox", "owl"]
    rows = list(prediction_rows(logits.astype(np.float32), names, top_k=2, num_classes=4))
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = exp / exp.sum(axis=1, keepdims=True)
    for row, chances in zip(rows, probabilities):
        first, second = np.argsort(-chances)[:2]
        assert row[0] == names[first] and row[2] == names[second]
        np.testing.assert_allclose([float(row[1]), float(row[3])], chances[[first, second]], rtol=1e-6)
    assert [row[0] for row in prediction_rows(logits, None, 1, 4)] == [str(i) for i in logits.argmax(axis=1)]
    assert header(5, 4, 4) == ["input", "prediction", "probability", *(f"{kind}_{rank}" for rank in (2, 3, 4)
                                                                        for kind in ("class", "probability"))]


def test_a_regression_row_holds_the_values():
    values = np.array([[1.5], [-2.25]], dtype=np.float32)
    assert list(prediction_rows(values, None, 3, None)) == [("1.5",), ("-2.25",)]
    assert header(3, None, 1) == ["input", "prediction"]
    assert header(3, None, 2) == ["input", "prediction_0", "prediction_1"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_counts_files_and_inputs_on_one_terminal_line(tmp_path):
    """Mutation caught: a table's rows (``FILE:ROW``) not matched to their file (the ETA never starts)."""
    for name in ("a.npy", "b.npy"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "c.png").write_bytes(b"")
    stream = Terminal()
    progress = PredictProgress([str(tmp_path / "a.npy"), str(tmp_path / "folder"), str(tmp_path / "b.npy")],
                               stream=stream, refresh=0.0)
    progress.update(f"{tmp_path}/a.npy:9", 10)
    progress.update(str(tmp_path / "folder" / "c.png"))
    progress.close()
    lines = stream.getvalue().split("\r")[1:]
    assert lines[0].startswith("predicting: file 1/3  10 inputs") and "ETA ?" not in lines[0]
    assert lines[1].startswith("predicting: file 2/3  11 inputs") and "ETA ?" not in lines[1]
    assert stream.getvalue().endswith("\n")
