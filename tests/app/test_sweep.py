"""Sweeps that name their winner: the summary beside the jobs, a failed job as a row, Optuna's objective and direction.

Every expectation is recomputed here from each job's own ``metrics.jsonl`` (its evaluation records), never read
from ``best.json`` or the summary under test. The learning rate jumps 30x after epoch 1 (``lr_schedule=step``,
``gamma=30``), so every job's best epoch is its first and its last evaluation is worse: ranking or optimising the
final value instead of the best gives a different answer.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from tests.common.callbacks import read_jsonl

REPO = Path(__file__).resolve().parents[2]
JUMP = ["lr_schedule=step", "lr_schedule.milestones=[1]", "lr_schedule.gamma=30", "trainer.epochs=2", "logger=quiet",
        "wrapper.ema_decay=null", "trainer.keep_checkpoints=1"]


def trainkit(*args, cwd):
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=400)


def evaluations(run_dir: Path) -> list:
    """[(epoch, eval/accuracy)] of a run, from its metrics.jsonl."""
    return [(r["epoch"], r["eval/accuracy"]) for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/accuracy" in r]


def best_of(run_dir: Path) -> tuple:
    """(best accuracy, its first epoch) of a run."""
    records = evaluations(run_dir)
    value = max(v for _, v in records)
    return value, next(e for e, v in records if v == value)


def test_a_sweep_summary_ranks_jobs_by_their_best_value_and_keeps_a_failed_job_as_a_row(tmp_path):
    result = trainkit("-m", "optimizer.lr=0.003,1e30,0.01", "trainer.max_nonfinite_steps=1", *JUMP, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]  # a job failed; the sweep went on and was summarised
    (sweep,) = (tmp_path / "multirun" / "digits_quickstart").iterdir()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]
    summary = json.loads((sweep / "summary.json").read_text())

    scored = {job: best_of(sweep / str(job)) for job in (0, 2)}
    finals = {job: evaluations(sweep / str(job))[-1][1] for job in (0, 2)}
    expected_order = sorted(scored, key=lambda job: -scored[job][0])
    assert sorted(finals, key=lambda job: -finals[job]) != expected_order  # the final values would rank otherwise
    assert [row["job"] for row in summary["jobs"]] == expected_order + [1]  # best first, the failed job last
    assert summary["winner"] == expected_order[0] and summary["failed"] == [1]
    assert summary["metric"] == "eval/accuracy" and summary["mode"] == "max"
    for row in summary["jobs"][:2]:
        assert row["best"] == pytest.approx(scored[row["job"]][0], abs=1e-6)
        assert row["best_epoch"] == scored[row["job"]][1] == 1
        assert row["final_metrics"]["accuracy"] == pytest.approx(finals[row["job"]], abs=1e-6)
        assert row["run_dir"] == str((sweep / str(row["job"])).resolve()) and row["wall_seconds"] > 0
        lr = "0.003" if row["job"] == 0 else "0.01"
        assert f"optimizer.lr={lr}" in row["overrides"]
    failed = summary["jobs"][2]
    assert failed["status"] == "failed" and "were skipped because their loss or gradients were not finite" in \
        failed["error"] and failed["best"] is None

    text = (sweep / "summary.md").read_text()
    assert f"Best single run: job {expected_order[0]}," in text and "- job 1 (optimizer.lr=1e" in text
    assert "One run per configuration: there is no spread to judge by" in text
    assert text in result.stdout  # printed as well as written
    assert "trainkit: error: 1 of 3 jobs failed (job 1)" in result.stderr
    assert (sweep / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_optuna_trials_are_scored_by_each_run_s_best_value(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = trainkit("-m", "recipe=digits_optuna", "hydra.sweeper.n_trials=3", "optimizer.lr=interval(0.003,0.01)",
                      *JUMP, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Directions: ['maximize']" in result.stdout + result.stderr and "Failed experiment" not in result.stderr
    (sweep,) = (tmp_path / "multirun" / "digits_optuna").iterdir()
    runs = sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    assert [p.name for p in runs] == ["0", "1", "2"]
    bests = {run.name: best_of(run)[0] for run in runs}
    for run in runs:
        assert evaluations(run)[-1][1] < bests[run.name]  # each last evaluation is worse: what was optimised before
    winner = max(bests, key=bests.get)
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(bests[winner], abs=1e-6)
    overrides = yaml.safe_load((sweep / winner / ".hydra" / "overrides.yaml").read_text())
    assert f"optimizer.lr={results['best_params']['optimizer.lr']}" in overrides
    assert json.loads((sweep / "summary.json").read_text())["winner"] == int(winner)


@pytest.mark.parametrize("overrides, direction", [
    ([], "maximize"),
    (["trainer.best_metric=loss"], "minimize"),
    (["trainer.best_metric=loss", "trainer.best_mode=max"], "maximize"),
    (["wrapper.ema_decay=0.9", "trainer.best_metric=ema_loss"], "minimize"),
])
def test_optuna_s_direction_follows_best_mode(overrides, direction):
    import trainkit.__main__  # noqa: F401 -- registers the configs and the trainkit_direction resolver

    with initialize_config_module("trainkit.configs", version_base=None):
        cfg = compose(config_name="config", overrides=["recipe=digits_optuna", *overrides], return_hydra_config=True)
    assert OmegaConf.select(cfg, "hydra.sweeper.direction") == direction


def _sweeper_config(overrides):
    import trainkit.__main__  # noqa: F401 -- registers the configs and the trainkit_direction resolver

    with initialize_config_module("trainkit.configs", version_base=None):
        return compose(config_name="config", overrides=["hydra/sweeper=optuna", *overrides], return_hydra_config=True)


@pytest.mark.parametrize("overrides, direction", [
    ([], "maximize"),
    (["trainer.best_metric=loss"], "minimize"),
    (["trainer.best_metric=loss", "trainer.best_mode=max"], "maximize"),
    (["hydra.sweeper.direction=maximize"], "maximize"),
])
def test_optuna_s_own_default_direction_is_replaced_by_best_mode_s(overrides, direction):
    """Mutation: settle_direction leaving the plugin's Enum default -> 'minimize' for an accuracy (red)."""
    from trainkit.app.sweep import settle_direction

    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = _sweeper_config(overrides)
    assert settle_direction(cfg) is None
    assert cfg.hydra.sweeper.direction == direction


@pytest.mark.parametrize("overrides", [
    ["hydra.sweeper.direction=minimize"],
    ["trainer.best_metric=loss", "hydra.sweeper.direction=maximize"],
    ["hydra.sweeper.direction=[minimize]"],
])
def test_a_direction_set_against_best_mode_is_refused(overrides):
    """Mutation: accepting any direction that was set -> no refusal (red)."""
    from trainkit.app.sweep import settle_direction

    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    problem = settle_direction(_sweeper_config(overrides))
    assert problem is not None and problem.startswith("hydra.sweeper.direction=") and "trainer.best_mode" in problem


def test_a_sweep_against_best_mode_stops_before_the_first_trial(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = trainkit("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "hydra.sweeper.direction=minimize",
                      "optimizer.lr=interval(0.003,0.01)", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("trainkit: error: hydra.sweeper.direction=minimize optimises against trainer.best_mode")
    assert "Directions" not in result.stdout + result.stderr and not (tmp_path / "multirun").exists()
