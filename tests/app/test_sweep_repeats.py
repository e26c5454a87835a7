"""Repeats and a winner you can trust: every configuration of a sweep run with several seeds, grouped, ranked by mean,
and the winner said to be separated from the others or within their noise.

Every expectation is recomputed here from each run's own files: the best value from its ``metrics.jsonl``
(checked equal to its ``best.json``), the test figure from its ``test/accuracy`` record, the seed and learning rate
from its ``.hydra/config.yaml``; means and standard deviations with NumPy, Welch's t-test written out with the
Welch-Satterthwaite degrees of freedom (only the t distribution's tail is scipy's).
"""
import json
import math
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus

from tests.common.callbacks import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TINY = ["trainer.epochs=1", "data.batch_size=128", "logger=quiet", "wrapper.ema_decay=null",
        "trainer.keep_checkpoints=1"]


def environment():
    return {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}


def trainkit(*args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=environment(), capture_output=True,
                          text=True, timeout=timeout)


def run_facts(run_dir: Path) -> dict:
    """A run's seed, learning rate, best accuracy and its epoch, and test accuracy, from its own files."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    evaluations = [(r["epoch"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    best = max(v for _, v in evaluations)
    stored = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert stored["value"] == pytest.approx(best, abs=1e-9)  # best.json agrees with the record
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    (test,) = [r["test/accuracy"] for r in records if "test/accuracy" in r]
    return {"seed": config["trainer"]["seed"], "lr": config["optimizer"]["lr"], "best": best,
            "epoch": next(e for e, v in evaluations if v == best), "test": test}


def welch_p(a, b) -> float:
    """Two-sided p of Welch's t-test, written out."""
    from scipy.stats import t as student

    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    statistic = (a.mean() - b.mean()) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(2 * student.sf(abs(statistic), dof))


def grouped(sweep: Path) -> dict:
    """{learning rate: [facts of each run]} over the sweep's job folders."""
    groups: dict = {}
    for run in sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        facts = run_facts(run)
        groups.setdefault(facts["lr"], []).append({**facts, "job": int(run.name)})
    return groups


def check_groups(summary: dict, groups: dict) -> None:
    """summary.json's configurations against the runs' own figures: ranked by mean, n, mean, sd, min, max."""
    means = {lr: np.mean([r["best"] for r in runs]) for lr, runs in groups.items()}
    assert [float(g["config"]["optimizer.lr"]) for g in summary["groups"]] == sorted(means, key=lambda k: -means[k])
    for group in summary["groups"]:
        runs = groups[float(group["config"]["optimizer.lr"])]
        assert sorted(r["seed"] for r in runs) == [0, 1, 2]  # every configuration ran with the same three seeds
        assert group["jobs"] == sorted(r["job"] for r in runs) and group["n"] == 3
        for name, key in (("best", "best"), ("best_epoch", "epoch"), ("test", "test")):
            values = np.array([r[key] for r in runs], dtype=np.float64)
            assert group[name]["mean"] == pytest.approx(values.mean(), abs=1e-9)
            assert group[name]["sd"] == pytest.approx(values.std(ddof=1), abs=1e-9)
            assert (group[name]["min"], group[name]["max"]) == pytest.approx((values.min(), values.max()), abs=1e-9)


def test_configurations_closer_than_their_seed_spread_are_within_noise(tmp_path):
    """Mutation: verdict treating p >= 0.05 as separated (comparison flipped) -> "separated" (red); sd with ddof=0 ->
    the sd check (red); grouping by every override (seed included) -> six groups of one (red)."""
    result = trainkit("-m", "optimizer.lr=0.01,0.011", "sweep.repeats=3", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "multirun" / "digits_quickstart").iterdir()
    summary = json.loads((sweep / "summary.json").read_text())
    groups = grouped(sweep)
    assert sorted(groups) == [0.01, 0.011]
    check_groups(summary, groups)

    first, second = ([r["best"] for r in groups[float(g["config"]["optimizer.lr"])]] for g in summary["groups"])
    assert abs(np.mean(first) - np.mean(second)) < max(np.std(first, ddof=1), np.std(second, ddof=1))  # the premise
    p = welch_p(first, second)
    assert p >= 0.05 and summary["verdict"]["kind"] == "within_noise"
    assert summary["verdict"]["p_values"]["1"] == pytest.approx(p, rel=1e-6)
    text = (sweep / "summary.md").read_text()
    assert "No clear winner: the top 2 are within noise: pick by other criteria or add repeats" in text
    assert text in result.stdout
    # only the swept key is a column; what every job shares is said once, above the table
    assert "| optimizer.lr | n | best eval/accuracy (max): mean ± sd (min–max) |" in text
    assert "Same in every job: sweep.repeats=3 trainer.epochs=1 data.batch_size=128" in text
    assert (sweep / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_clearly_better_configuration_is_named_separated_also_when_the_seed_is_swept(tmp_path):
    """A learning rate of 1e-7 (as good as 0, which is refused) against a working one, the seeds swept by hand.

    Mutation: welch_p returning 1.0 -> "within noise" (red); ranking groups ascending -> the order check (red)."""
    result = trainkit("-m", "optimizer.lr=1e-7,0.01", "trainer.seed=0,1,2", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "multirun" / "digits_quickstart").iterdir()
    summary = json.loads((sweep / "summary.json").read_text())
    groups = grouped(sweep)
    check_groups(summary, groups)
    p = welch_p([r["best"] for r in groups[0.01]], [r["best"] for r in groups[1e-7]])
    assert p < 0.05 and summary["verdict"]["kind"] == "separated"
    assert "Winner: optimizer.lr=0.01, separated from the runner-up (optimizer.lr=1e-07)" in result.stdout


def test_repeats_are_refused_where_they_cannot_run(tmp_path):
    """Mutation: dropping the swept-seed check -> the sweep runs 2 x 2 jobs (red)."""
    result = trainkit("sweep.repeats=3", *TINY, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == (
        "trainkit: error: sweep.repeats=3 runs each configuration of a -m sweep with 3 seeds: add -m to the command, "
        "or leave sweep.repeats at 1 for one run")
    result = trainkit("-m", "trainer.seed=0,1", "sweep.repeats=2", *TINY, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "trainkit: error: sweep.repeats=2 gives every configuration the seeds trainer.seed=0..1, but the sweep sets "
        "trainer.seed per job too")
    assert not list(tmp_path.glob("multirun/*/*"))  # no job ran, no empty sweep folder is left
    result = trainkit("-m", "sweep.repeats=0", *TINY, cwd=tmp_path)
    assert result.returncode == 2 and "trainkit: error: sweep.repeats=0 is not valid" in result.stderr


def test_a_huge_repeats_is_one_line_before_the_sweep_folder_exists(tmp_path):
    """``sweep.repeats=1000000000`` (a typo for 10) grew memory by 700 MB/s before any job started; 0 was refused
    by job 0, after the sweep folder and a summary were written. Mutation: the launcher's setup without
    size_problem (red: a MemoryError under the 4 GiB limit in 2 s, exit 1; the second leaves multirun/)."""
    def bounded():  # under a mutation the job list grows without end: a MemoryError, not a shared machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2 ** 30, 4 * 2 ** 30))

    for repeats in ("1000000000", "0"):
        result = subprocess.run([sys.executable, "-m", "trainkit", "-m", f"sweep.repeats={repeats}", "logger=quiet"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=bounded,
                                env=environment())
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr == (f"trainkit: error: sweep.repeats={repeats} is not valid: it must be an integer in "
                                 "[1, 1,000] (the seeds each configuration of a -m sweep runs with)\n")
        assert list(tmp_path.iterdir()) == []  # no multirun/ folder, no summary


def test_a_sweeper_gets_the_mean_of_a_configuration_s_repeats():
    """The launcher's one result per job a sweeper asked for (Optuna's trial value). Mutation: returning the first
    repeat's value instead of the mean (red)."""
    from hydra_plugins.trainkit_launcher import TrainkitLauncher

    launcher = TrainkitLauncher()
    launcher.repeats = 3

    def result(value, seed):
        job = JobReturn(overrides=["optimizer.lr=0.01", f"trainer.seed={seed}"], status=JobStatus.COMPLETED)
        job.return_value = value
        return job

    combined = launcher._combined([result(0.9, 0), result(0.8, 1), result(0.4, 2)])
    assert combined.return_value == pytest.approx(np.mean([0.9, 0.8, 0.4])) and combined.overrides == [
        "optimizer.lr=0.01"]
    assert math.isnan(launcher._combined([result(0.9, 0), result(float("nan"), 1), result(0.4, 2)]).return_value)


@pytest.mark.slow  # test_a_sweeper_gets_the_mean_of_a_configuration_s_repeats covers the mean without training
def test_optuna_s_trial_value_is_the_mean_of_its_repeats(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = trainkit("-m", "recipe=digits_optuna", "hydra.sweeper.n_trials=2", "sweep.repeats=2",
                      "optimizer.lr=interval(0.003,0.01)", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "multirun" / "digits_optuna").iterdir()
    bests = {int(p.name): run_facts(p)["best"] for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()}
    assert sorted(bests) == [0, 1, 2, 3]  # trial t's repeats are jobs 2t and 2t + 1
    trial_means = [np.mean([bests[2 * t], bests[2 * t + 1]]) for t in range(2)]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(max(trial_means), abs=1e-9)


def wait_for_training(run_dir: Path, process) -> None:
    """Until the job in `run_dir` has recorded two training steps (the process must still run)."""
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        try:
            if len([r for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]) >= 2:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise AssertionError(f"job {run_dir.name} did not train: {process.poll()}")


def test_a_stopped_sweep_keeps_its_summary_and_continues_with_one_command(tmp_path):
    """SIGTERM in job 1 of 3: the summary of jobs 0-1 is written, and the command given continues the stopped job
    from its checkpoint, runs job 2 and leaves job 0 alone. Mutations: no summary on a signal (red: no summary.json);
    a continued sweep that runs its completed jobs again (red: job 0 "nothing is left to train", exit 2)."""
    sweep = tmp_path / "sweep"
    command = ["-m", "optimizer.lr=0.01,0.011,0.012", "trainer.epochs=2", "logger.log_every_n_steps=1", *TINY[1:],
               f"hydra.sweep.dir={sweep}"]
    process = subprocess.Popen([sys.executable, "-m", "trainkit", *command], cwd=tmp_path, env=environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_training(sweep / "1", process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 143, err[-3000:]
    summary = json.loads((sweep / "summary.json").read_text())
    assert {row["job"]: row["status"] for row in summary["jobs"]} == {0: "completed", 1: "interrupted"}
    assert "# Sweep summary" in out
    marker = ("Continue the sweep (the stopped job from its checkpoint, the jobs that did not run, none that "
              "completed) with: ")
    (line,) = [line for line in err.splitlines() if marker in line]
    command = line.split(marker, 1)[1].split()
    assert command[:3] == ["python", "-m", "trainkit"] and command[-1] == "trainer.resume=auto"
    job0 = {p: p.read_bytes() for p in (sweep / "0").rglob("*") if p.is_file()}

    result = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, env=environment(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"job 0 completed before: not run again ({sweep / '0'})" in result.stderr
    assert {p: p.read_bytes() for p in (sweep / "0").rglob("*") if p.is_file()} == job0
    summary = json.loads((sweep / "summary.json").read_text())
    assert sorted((row["job"], row["status"]) for row in summary["jobs"]) == [(0, "completed"), (1, "completed"),
                                                                              (2, "completed")]
    assert summary["varying"] == ["optimizer.lr"]  # jobs 1-2 ran with trainer.resume=auto, job 0 without: one axis
    assert f"resuming from {sweep / '1' / 'checkpoints'}" in (sweep / "1" / "train.log").read_text()


def expected_welch_p(a, b) -> float:
    """Welch's two-sided p where a group may have no spread: written out with its variance 0 (the other group's
    spread alone then decides); two groups without spread are told apart exactly when their means differ."""
    from scipy.stats import t as student

    a, b = np.asarray(a, float), np.asarray(b, float)
    # equal values have variance 0 exactly (NumPy's mean of five 0.838s is not 0.838, and its variance not 0)
    va, vb = (0.0 if len(set(x)) == 1 else x.var(ddof=1) / len(x) for x in (a, b))
    if va + vb == 0:
        return 0.0 if a[0] != b[0] else 1.0
    statistic = (a.mean() - b.mean()) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0.0) + (vb ** 2 / (len(b) - 1) if vb else 0.0))
    return float(2 * student.sf(abs(statistic), dof))


def write_sweep(folder: Path, groups: dict) -> None:
    """A sweep folder as the jobs leave it: one record and one best.json per job (learning rate -> best values)."""
    job = 0
    for lr, values in groups.items():
        for seed, value in enumerate(values):
            run_dir = folder / str(job)
            (run_dir / "checkpoints").mkdir(parents=True)
            (run_dir / "checkpoints" / "best.json").write_text(json.dumps(
                {"metric": "eval/accuracy", "mode": "max", "value": value, "epoch": 1}))
            (folder / f".job-{job}.json").write_text(json.dumps(
                {"job": job, "overrides": [f"optimizer.lr={lr}", f"trainer.seed={seed}"], "run_dir": str(run_dir),
                 "status": "completed", "error": None, "wall_seconds": 1.0, "final_metrics": {}, "exit_status": 0}))
            job += 1


def test_a_group_of_equal_repeats_is_judged_by_the_other_group_s_spread(tmp_path):
    """A configuration whose repeats all score the same (a tiny set: every seed gets 0.9) against one with a spread:
    Welch's t-test with one variance 0 is well defined, and the verdict follows its p (written out here) in 100
    seeded cases, either way. Mutation: welch_p returning p = 0 as soon as *one* group has no spread (red: the winner
    is called "separated" where the other group's spread covers the gap)."""
    from trainkit.app.sweep.summary import summarize

    rng = random.Random(0)
    kinds = {"separated": 0, "within_noise": 0}
    for case in range(100):
        flat = [round(rng.uniform(0.5, 0.9), 3)] * rng.randint(2, 5)
        spread = rng.uniform(0.001, 0.05)
        centre = flat[0] + rng.choice([-1, 1]) * spread * rng.uniform(0.0, 4.0)
        noisy = [centre + rng.gauss(0.0, spread) for _ in range(rng.randint(2, 5))]
        if case % 10 == 0:  # now and then both without spread: told apart exactly when the means differ
            noisy = [rng.choice([flat[0], flat[0] + 0.01])] * rng.randint(2, 4)
        sweep = tmp_path / str(case)
        write_sweep(sweep, {0.01: flat, 0.02: noisy})
        summary = summarize(sweep)
        (flat_group,) = [group for group in summary["groups"] if group["config"] == {"optimizer.lr": "0.01"}]
        assert (flat_group["best"]["mean"], flat_group["best"]["sd"]) == (flat[0], 0.0)  # shown without a spread
        verdict = summary["verdict"]
        p = expected_welch_p(flat, noisy)
        kind = "separated" if p < 0.05 else "within_noise"
        assert verdict["kind"] == kind, (case, flat, noisy, p, verdict["line"])
        assert verdict["p_values"][1] == pytest.approx(p, rel=1e-6, abs=1e-12)
        kinds[kind] += len(set(noisy)) > 1
    assert min(kinds.values()) >= 15, kinds  # both verdicts were met with one group of equal repeats
