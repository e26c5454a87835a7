"""The summary's grouping and its reading of each job's best.json, on sweep folders written here by hand (no
training): a continued sweep's ``trainer.resume=auto`` does not split a configuration's repeats, and a hand-edited
``best.json`` is warned of in one line and listed as unreadable, not silently counted as n=0 (issue 47). Expected
groups and means are computed here with NumPy from the values written."""
import json
import random
from pathlib import Path

import numpy as np
import pytest

from trainkit.app.sweep import records as sweep_records
from trainkit.app.sweep.summary import markdown, summarize


def write_job(sweep: Path, job: int, overrides, best, status="completed"):
    run = sweep / str(job)
    (run / "checkpoints").mkdir(parents=True)
    if best is not None:
        text = best if isinstance(best, str) else json.dumps(
            {"metric": "eval/accuracy", "mode": "max", "value": best, "epoch": 1, "step": 10})
        (run / "checkpoints" / "best.json").write_text(text)
    record = {"job": job, "overrides": overrides, "run_dir": str(run.resolve()), "status": status, "error": None,
              "wall_seconds": 1.0, "final_metrics": {}, "exit_status": 0}
    (sweep / f".job-{job}.json").write_text(json.dumps(record))


def test_a_continued_sweep_groups_a_configuration_s_repeats_in_one_row(tmp_path):
    """Seeded random sweeps, each continued: a random subset of its jobs ran again with trainer.resume=auto (and some
    with a run_dir or a hydra key among their overrides). Mutation: trainer.resume counted as a varying key (red:
    a configuration split into two rows, trainer.resume a column)."""
    generator = random.Random(0)
    for case in range(60):  # each case is a sweep folder and a summary (Welch tests): 60 keep it near 3 s
        sweep = tmp_path / str(case)
        sweep.mkdir()
        rates = generator.sample(["0.001", "0.003", "0.01", "0.03"], generator.randint(2, 4))
        repeats = generator.randint(2, 4)
        expected, job = {}, 0
        for rate in rates:
            for seed in range(repeats):
                value = round(generator.uniform(0.1, 0.99), 6)
                overrides = [f"optimizer.lr={rate}", f"trainer.seed={seed}", "trainer.epochs=2"]
                if generator.random() < 0.4:  # ran again by the continuing command
                    overrides.append("trainer.resume=auto")
                    if generator.random() < 0.3:
                        overrides.append(f"run_dir={sweep}/{job}")
                    if generator.random() < 0.3:
                        overrides.append("hydra.job.chdir=false")
                write_job(sweep, job, overrides, value)
                expected.setdefault(rate, []).append((job, value))
                job += 1
        summary = summarize(sweep)
        assert summary["varying"] == ["optimizer.lr"]
        assert len(summary["groups"]) == len(rates)
        for group in summary["groups"]:
            runs = expected[group["config"]["optimizer.lr"]]
            assert group["jobs"] == [j for j, _ in runs] and group["n"] == repeats
            assert group["best"]["mean"] == pytest.approx(np.mean([v for _, v in runs]), abs=1e-12)
        assert "| optimizer.lr | n |" in markdown(summary)


@pytest.mark.parametrize("edited, why", [
    ('{"metric": "eval/accuracy", "mode": "max", "value": 0.9', "is not JSON"),  # cut short
    ('{"metric": "eval/accuracy", "mode": "max", "value": "0.95"}', 'has no number under "value" ("0.95")'),
    ('{"metric": "eval/accuracy", "mode": "max", "value": true}', 'has no number under "value" (true)'),
    ('[0.95]', "holds a JSON list"),
])
def test_a_hand_edited_best_json_is_warned_of_and_listed_not_counted_silently(tmp_path, capsys, monkeypatch,
                                                                              edited, why):
    """Mutations: read_best without its warning (red: stderr empty); the summary without the unreadable rows (red:
    no such line in summary.md); a bool taken as a number (red: the 'true' case counts as 1.0)."""
    monkeypatch.setattr(sweep_records, "_warned", set())
    for job, (rate, seed, best) in enumerate([("0.01", 0, 0.8), ("0.01", 1, edited), ("0.03", 0, 0.7),
                                              ("0.03", 1, 0.75)]):
        write_job(tmp_path, job, [f"optimizer.lr={rate}", f"trainer.seed={seed}"], best)
    write_job(tmp_path, 4, ["optimizer.lr=0.1", "trainer.seed=0"], None, status="failed")  # no best.json: no warning
    summary = summarize(tmp_path)
    path = tmp_path / "1" / "checkpoints" / "best.json"
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"trainkit: warning: {path} {why}")
    assert line.endswith("that run's best value is left out (the summary counts it as unreadable, not as a result)")
    groups = {g["config"]["optimizer.lr"]: g for g in summary["groups"]}
    assert groups["0.01"]["n"] == 1 and groups["0.01"]["jobs"] == [0, 1]
    assert groups["0.01"]["best"]["mean"] == pytest.approx(0.8)
    rows = {row["job"]: row for row in summary["jobs"]}
    assert rows[1]["unreadable"].startswith(why) and rows[4]["unreadable"] is None
    text = markdown(summary)
    assert "Jobs whose result could not be read (completed, but left out of n and the ranking):" in text
    assert f"- job 1 (optimizer.lr=0.01 trainer.seed=1): {path} {why}" in text
    summarize(tmp_path)  # read again (the sweep's end after the launcher's objective): not warned twice
    assert capsys.readouterr().err == ""


def test_a_missing_best_json_is_not_a_warning(tmp_path, capsys):
    """A run without evaluation has no best.json: nothing to warn of (trainer.evaluate=false)."""
    write_job(tmp_path, 0, ["optimizer.lr=0.01"], None)
    summary = summarize(tmp_path)
    assert capsys.readouterr().err == "" and summary["jobs"][0]["unreadable"] is None
