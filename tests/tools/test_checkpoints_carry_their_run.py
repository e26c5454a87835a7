"""A run's checkpoints hold everything the tools need: best.ckpt carries its run's config (a run that is not the
default one is evaluated in its own network, not the default's), and a table run predicts without its training
file (the stored statistics, not the CSV read again)."""
import csv

import numpy as np

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.tools import evaluate, predict


def test_best_ckpt_alone_is_evaluated_in_its_own_runs_network(tmp_path):
    """model.width=4 is not the default (16): the default network would not fit best.ckpt. The tool's accuracy
    equals the run's own evaluation of best.ckpt (eval/accuracy at the best step). Mutation caught: the config
    not stored in best.ckpt."""
    run = tmp_path / "run"
    result = train(compose_config(["data.batch_size=128", "model.width=4", "trainer.epochs=1", "trainer.test=false",
                                   "logger.progress=off", f"run_dir={run}"]))
    best = run / "checkpoints" / "best.ckpt"
    elsewhere = tmp_path / "copy" / "best.ckpt"  # no run directory around it: the file alone
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(best.read_bytes())
    config = evaluate.evaluation_config(elsewhere, elsewhere, [])
    assert config.model.width == 4
    assert evaluate.main([str(elsewhere), "--output", str(tmp_path / "report.json")]) == 0
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["accuracy"] == result.metrics["accuracy"]


def write_table(path, rows):
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["a", "b", "label"])
        writer.writerows(rows)


def predictions(path):
    with open(path, newline="") as stream:
        return [row for row in csv.DictReader(stream)]


def test_a_table_run_predicts_the_same_with_its_training_file_edited_or_gone(tmp_path):
    """Mutation caught: load_trained preparing the data (reading the CSV) instead of restoring the stored state."""
    rng = np.random.default_rng(0)
    rows = [[round(float(x), 3), round(float(y), 3), "yes" if x + y > 0 else "no"]
            for x, y in rng.normal(size=(80, 2))]
    table = tmp_path / "train.csv"
    write_table(table, rows)
    run = tmp_path / "run"
    train(compose_config(["data=table", f"data.path={table}", "data.target=label", "data.batch_size=8", "model=mlp",
                          "model.hidden_sizes=[4]", "trainer.epochs=1", "trainer.test=false", "logger.progress=off",
                          f"run_dir={run}"]))
    new = tmp_path / "new.csv"
    with open(new, "w", newline="") as stream:
        csv.writer(stream).writerows([["a", "b"], [0.5, -0.1], [-2.0, 0.3]])
    assert predict.main([str(run), str(new), "--out", str(tmp_path / "before.csv")]) == 0
    write_table(table, [[x * 10 + 5, y * 3, label] for x, y, label in rows])  # other statistics entirely
    assert predict.main([str(run), str(new), "--out", str(tmp_path / "edited.csv")]) == 0
    table.unlink()
    assert predict.main([str(run), str(new), "--out", str(tmp_path / "gone.csv")]) == 0
    before = predictions(tmp_path / "before.csv")
    assert predictions(tmp_path / "edited.csv") == before == predictions(tmp_path / "gone.csv")
