"""predict's batches, non-finite inputs and CSV cells, on a NumPy stand-in for the network: no training, no process.

The stand-in records every call (batch shape, execution mode) and answers with NumPy arithmetic, so the rows can be
compared with the same arithmetic done one input at a time, here in the test.
"""
import csv
import random
import re
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest

from trainkit.data.predict_inputs import table_samples
from trainkit.errors import DataError
from trainkit.rundir.output_file import spreadsheet_row, spreadsheet_text
from trainkit.tools.predict import AUTO_BATCH_MAX, auto_batch_size, predict, write_csv

FEATURES, CLASSES = 5, 4


class LinearNetwork:
    """x @ weights + bias, in NumPy; records (batch size, mode) of each call."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.weights = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
        self.bias = rng.normal(size=CLASSES).astype(np.float32)
        self.calls = []

    def __call__(self, tensor):
        batch = tensor.asnumpy()
        self.calls.append((len(batch), ms.get_context("mode")))
        return ms.Tensor((batch @ self.weights + self.bias).astype(np.float32))


def trained_on(samples):
    """What predict reads of a trained run: a network, a data module answering predict_samples, num_classes."""
    data = SimpleNamespace(predict_samples=lambda inputs: iter(samples))
    return SimpleNamespace(network=LinearNetwork(), data=data, num_classes=CLASSES)


def one_at_a_time(network, rows):
    """Softmax probabilities of each row alone, float64 NumPy."""
    out = []
    for row in rows:
        logits = row.astype(np.float64) @ network.weights.astype(np.float64) + network.bias
        exp = np.exp(logits - logits.max())
        out.append(exp / exp.sum())
    return np.array(out)


def run(trained, batch_size=None, skip_bad=False, inputs=("t.csv",)):
    rows = []
    counts = predict(trained, list(inputs), rows.append, top_k=CLASSES, batch_size=batch_size, names=[],
                     skip_bad=skip_bad)
    return counts, rows[0], rows[1:]


def probabilities_of(rows):
    """Each row's probabilities back in class order (rows hold (class, probability) pairs, best first)."""
    table = np.zeros((len(rows), CLASSES))
    for index, row in enumerate(rows):
        for rank in range(CLASSES):
            table[index, int(row[1 + 2 * rank])] = float(row[2 + 2 * rank])
    return table


def test_batches_answer_as_one_input_at_a_time_and_compile_one_shape():
    """37 inputs in batches of 8: the first eagerly, every later call 8 inputs (the last 5 padded), rows within
    1e-6 of each input alone.

    Mutations caught: the padding's outputs written (41 rows); the last batch not padded (a call of 5: a second
    graph compile); the first batch not eager; rows paired with the wrong inputs (padding taken from the front)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    features = np.random.default_rng(1).normal(size=(37, FEATURES)).astype(np.float32)
    trained = trained_on([(f"t.csv:{i}", row, None) for i, row in enumerate(features)])
    counts, header, rows = run(trained, batch_size=8)
    assert counts.predicted == 37 and header[0] == "input"
    assert [row[0] for row in rows] == [f"t.csv:{i}" for i in range(37)]
    np.testing.assert_allclose(probabilities_of(rows), one_at_a_time(trained.network, features), atol=1e-6)
    assert trained.network.calls == [(8, ms.PYNATIVE_MODE)] + [(8, ms.GRAPH_MODE)] * 4
    assert ms.get_context("mode") == ms.GRAPH_MODE  # the eager batch gives the mode back


def test_a_single_batch_runs_once_eagerly_and_the_batch_size_follows_the_input_size():
    """Mutation caught: a fixed default batch size (64: 4 calls for 200 small inputs)."""
    features = np.random.default_rng(2).normal(size=(200, FEATURES)).astype(np.float32)
    trained = trained_on([(f"t.csv:{i}", row, None) for i, row in enumerate(features)])
    counts, _, rows = run(trained)
    assert counts.predicted == 200 and trained.network.calls == [(200, ms.PYNATIVE_MODE)]
    np.testing.assert_allclose(probabilities_of(rows), one_at_a_time(trained.network, features), atol=1e-6)
    assert auto_batch_size(np.zeros((1, 8, 8))) == AUTO_BATCH_MAX
    assert auto_batch_size(np.zeros((3, 224, 224))) == 2 ** 20 // (3 * 224 * 224) == 6
    assert auto_batch_size(np.zeros((3, 2048, 2048))) == 1


def test_a_non_finite_input_stops_naming_file_and_row_unless_skip_bad_counts_it():
    """NaN and inf rows (among 30, batches of 7) stop the prediction at the first, naming its file and row; with
    skip_bad they are left out and counted, and the other rows are those of each input alone.

    Mutations caught: no check (a NaN row predicted); the check on the first row of a batch only; skip_bad dropping
    the wrong rows (the ids shift against the probabilities)."""
    rng = random.Random(0)
    features = np.random.default_rng(3).normal(size=(30, FEATURES)).astype(np.float32)
    bad = sorted(rng.sample(range(30), 6))
    for index in bad:
        features[index, rng.randrange(FEATURES)] = rng.choice([np.nan, np.inf, -np.inf])
    samples = [(f"data/new.csv:{i}", row, None) for i, row in enumerate(features)]
    with pytest.raises(DataError, match=rf"^data/new\.csv, row {bad[0]} holds (nan|inf|-inf): .*--skip-bad"):
        run(trained_on(samples), batch_size=7)
    trained = trained_on(samples)
    counts, _, rows = run(trained, batch_size=7, skip_bad=True)
    good = [i for i in range(30) if i not in bad]
    assert (counts.predicted, counts.non_finite) == (24, 6)
    assert [row[0] for row in rows] == [f"data/new.csv:{i}" for i in good]
    np.testing.assert_allclose(probabilities_of(rows), one_at_a_time(trained.network, features[good]), atol=1e-6)
    assert {size for size, mode in trained.network.calls if mode == ms.GRAPH_MODE} == {7}  # one graph shape


def test_a_table_row_alone_is_named_by_its_file(tmp_path):
    """A data module naming rows by number alone (one input): the message names the file."""
    samples = [("0", np.zeros(FEATURES, np.float32), None), ("1", np.full(FEATURES, np.nan, np.float32), None)]
    with pytest.raises(DataError, match=r"^t\.csv, row 1 holds nan"):
        run(trained_on(samples))


FORMULA = "=+-@\t\r"


def starts_formula(text):
    return bool(text) and text[0] in FORMULA


def is_plain_number(text):
    """Digits, signs, a point and exponents that float() reads: what a spreadsheet shows as a number."""
    if not text or set(text) - set("0123456789+-.eE"):
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def random_cell(rng):
    alphabet = FORMULA + "0123456789.eE,;|!'\" AZaz()é\n" + "".join(chr(c) for c in range(0x21, 0x7f))
    kind = rng.random()
    if kind < 0.3:  # a number, often negative
        return f"{rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-12, 3):.7g}"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    return rng.choice(FORMULA) + text if kind < 0.8 else text


def test_no_cell_starts_a_formula_and_numbers_stay_numbers():
    """300 seeded cells, then 300 rows of them: a string starting with = + - @ tab or CR gets a leading quote unless
    it is a plain number; everything else is unchanged.

    Mutations caught: a missing trigger (tab, CR); negative numbers quoted; the quote added to safe text."""
    rng = random.Random(0)
    cells = [random_cell(rng) for _ in range(300)]
    assert sum(is_plain_number(c) and c.startswith("-") for c in cells) > 20
    assert sum(starts_formula(c) and not is_plain_number(c) for c in cells) > 100
    for cell in cells:
        written = spreadsheet_text(cell)
        if starts_formula(cell) and not is_plain_number(cell):
            assert written == "'" + cell, repr(cell)
        else:
            assert written == cell, repr(cell)
    assert spreadsheet_text(-2.5) == -2.5 and spreadsheet_text(None) is None
    for _ in range(300):  # whole rows: the one-scan shortcut must agree with the rule cell by cell
        row = tuple(random_cell(rng) + rng.choice(["", "\x1f=", "\x1f"]) for _ in range(rng.randint(1, 7)))
        expected = ["'" + c if starts_formula(c) and not is_plain_number(c) else c for c in row]
        assert list(spreadsheet_row(row)) == expected, row
    assert spreadsheet_row(("a", 1.5, "=b")) == ["a", 1.5, "'=b"]


def test_the_csv_file_quotes_hostile_class_and_input_names(tmp_path):
    """Input ids and class names an attacker chose are written as text; probabilities stay plain numbers.

    Mutation caught: write_csv writing cells as they come."""
    rng = random.Random(1)
    names = [rng.choice(FORMULA) + "cmd|' /C calc'!A0" for _ in range(CLASSES)]
    ids = [random_cell(rng) for _ in range(40)]
    features = np.random.default_rng(4).normal(size=(40, FEATURES)).astype(np.float32)
    trained = trained_on([(sample_id, row, None) for sample_id, row in zip(ids, features)])
    out = tmp_path / "p.csv"
    write_csv(out, lambda write_row: predict(trained, ["x"], write_row, top_k=2, batch_size=16, names=names))
    with out.open(newline="") as handle:
        rows = list(csv.reader(handle))
    number = re.compile(r"[0-9.e+-]+")
    for row, sample_id in zip(rows[1:], ids):
        assert row[0] == ("'" + sample_id if starts_formula(sample_id) and not is_plain_number(sample_id)
                          else sample_id)
        assert row[1] in ["'" + name for name in names] and row[3] in ["'" + name for name in names]
        assert number.fullmatch(row[2]) and 0 < float(row[2]) <= 1


def test_table_rows_prepared_in_blocks_equal_rows_prepared_one_by_one(tmp_path):
    """Mutation caught: a block's samples paired with the wrong rows (block boundaries at 4096 rows)."""
    rows = np.random.default_rng(5).normal(size=(5000, 2, 3))
    np.save(tmp_path / "a.npy", rows)
    one = list(table_samples([str(tmp_path / "a.npy")], lambda row: row * 3.0 + 1, (2, 3), "an input"))
    block = list(table_samples([str(tmp_path / "a.npy")], lambda block: block * 3.0 + 1, (2, 3), "an input",
                               batched=True))
    assert [item[0] for item in block] == [item[0] for item in one]
    np.testing.assert_array_equal(np.stack([item[1] for item in block]), rows * 3.0 + 1)


@pytest.mark.parametrize("batched", [True, False])
def test_a_table_row_holding_nan_or_inf_is_never_prepared_and_is_refused_by_name(tmp_path, batched):
    """A CIFAR-10-like prepare casts to uint8, which turns NaN into a pixel value: the row must be caught before it.

    Mutations caught: the raw rows not checked (the cast NaN predicted as a picture); the bad rows' ids shifted
    against the good rows' samples (a block with holes)."""
    rng = random.Random(2)
    rows = np.random.default_rng(6).uniform(0, 255, size=(50, FEATURES))
    bad = sorted(rng.sample(range(50), 7))
    for index in bad:
        rows[index, rng.randrange(FEATURES)] = rng.choice([np.nan, np.inf, -np.inf])
    np.save(tmp_path / "t.npy", rows)
    seen = []

    def prepare(values):  # as Cifar10Data.predict_samples: a cast to uint8, then float32
        seen.append(np.asarray(values))
        return np.asarray(values, dtype=np.uint8).astype(np.float32)

    got = list(table_samples([str(tmp_path / "t.npy")], prepare, (FEATURES,), "a row", batched=batched))
    assert all(np.isfinite(values).all() for values in seen)
    assert [item[0] for item in got] == [f"{tmp_path}/t.npy:{i}" for i in range(50)]
    for index, (_, sample, error) in enumerate(got):
        if index in bad:
            assert sample is None and re.fullmatch(rf"{tmp_path}/t\.npy, row {index} holds -?(nan|inf)", error)
        else:
            assert error is None and np.array_equal(sample, rows[index].astype(np.uint8).astype(np.float32))
    data = SimpleNamespace(predict_samples=lambda inputs: table_samples(inputs, prepare, (FEATURES,), "a row",
                                                                        batched=batched))
    trained = SimpleNamespace(network=LinearNetwork(), data=data, num_classes=CLASSES)
    with pytest.raises(DataError, match=rf"^{tmp_path}/t\.npy, row {bad[0]} holds -?(nan|inf): inputs must be finite"):
        run(trained, inputs=[str(tmp_path / "t.npy")])
    counts, _, written = run(trained, inputs=[str(tmp_path / "t.npy")], skip_bad=True)
    assert (counts.predicted, counts.non_finite) == (43, 7)
    assert [row[0] for row in written] == [f"{tmp_path}/t.npy:{i}" for i in range(50) if i not in bad]
