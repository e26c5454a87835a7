"""The run's plan (trainkit.app.plan: RunPlan, StepPlan) against counts written out by hand, over a seeded range of
runs: micro-batches, updates, sinks, Model.train's epochs, the evaluation interval, the parts a config asks for."""
import random
from pathlib import Path

from trainkit.app.plan import StepPlan


def test_the_counts_follow_from_epochs_steps_windows_and_sinks():
    rng = random.Random(0)
    for _ in range(300):
        epochs, steps, k = rng.randrange(1, 50), rng.randrange(1, 400), rng.randrange(1, 9)
        sink = rng.choice([-1, 0, *[d for d in range(1, steps + 1) if steps % d == 0]])
        plan = StepPlan(epochs=epochs, steps_per_epoch=steps, accumulation_steps=k, sink_size=sink)
        micro = sum(steps for _ in range(epochs))
        assert plan.micro_steps == micro
        assert plan.updates == len(range(k, micro + 1, k))  # the windows that complete
        sinks = steps // sink if sink > 0 else 1
        assert plan.sinks_per_epoch == sinks and plan.model_epochs == epochs * sinks


def test_the_run_plan_derives_its_intervals_and_sizes_from_the_step_arithmetic():
    """RunPlan's evaluation interval (in Model.train's epochs), steps per Model epoch, samples per rank and a resume's
    position, against the same counts written out here."""
    from trainkit.app.plan import RunPlan

    rng = random.Random(1)
    for _ in range(300):
        epochs, steps, group = rng.randrange(1, 30), rng.randrange(1, 200), rng.randrange(1, 5)
        batch = rng.randrange(1, 64)
        sink = rng.choice([-1, *[d for d in range(1, steps + 1) if steps % d == 0]])
        interval = rng.randrange(0, 4)
        plan = RunPlan(run_dir=Path("/r"), group_size=group, eval_interval=interval,
                       steps=StepPlan(epochs=epochs, steps_per_epoch=steps, sink_size=sink,
                                      samples_per_step=batch * group))
        sinks = steps // sink if sink > 0 else 1
        assert plan.eval_every == (interval * sinks if interval else epochs * sinks)
        assert plan.steps.steps_per_model_epoch == (sink if sink > 0 else steps)
        assert plan.samples_per_rank == batch
        assert plan.checkpoints == Path("/r/checkpoints")
        done = rng.randrange(0, epochs * steps)
        assert plan.steps.position_of(done) == (1 + done // steps, done - (done // steps) * steps)


def test_plan_run_resolves_the_config_once():
    """plan_run over a seeded range of configs: the counts, the parts to build and the records follow from the keys
    as written out here (writer or not, early stopping's tag and mode, best.ckpt's)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from trainkit.app.config import compose_config
    from trainkit.app.plan import plan_run, step_plan

    base = compose_config(["run_dir=/tmp/unused"])
    rng = random.Random(2)
    for _ in range(150):
        cfg = base.copy()
        epochs, steps, k, batch = rng.randrange(1, 20), rng.randrange(1, 100), rng.randrange(1, 5), rng.randrange(1, 33)
        group = rng.randrange(1, 4)
        rank = rng.randrange(group)
        early = rng.choice([None, "loss", "accuracy"])
        evaluate, save = rng.random() < 0.8, rng.random() < 0.7
        for key, value in {"trainer.epochs": epochs, "wrapper.accumulation_steps": k, "data.batch_size": batch,
                           "trainer.early_stopping.metric": early, "trainer.evaluate": evaluate,
                           "trainer.save_checkpoints": save, "trainer.max_nonfinite_steps": rng.choice([None, 0, 5]),
                           "logger.metrics_file": rng.choice([None, "metrics.jsonl"])}.items():
            OmegaConf.update(cfg, key, value)
        parallel = SimpleNamespace(rank=rank, group_size=group, writer=rank == 0)
        plan = plan_run(cfg, Path("/runs/a"), step_plan(cfg, steps, -1, group), parallel, False, test=False)
        assert plan.steps.micro_steps == epochs * steps and plan.steps.updates == (epochs * steps) // k
        assert plan.steps.samples_per_step == batch * group and plan.samples_per_rank == batch
        assert plan.writer == (rank == 0) and (plan.rank, plan.group_size) == (rank, group)
        assert plan.metrics_file == (cfg.logger.metrics_file if rank == 0 else None)
        assert plan.tensorboard == (rank == 0 and cfg.logger.tensorboard)
        assert plan.best_checkpoint == (rank == 0 and evaluate and save)
        assert plan.max_nonfinite_steps == (cfg.trainer.max_nonfinite_steps or 0)
        if early is None:
            assert plan.early_stopping is None
        else:
            assert plan.early_stopping.metric == f"eval/{early}"
            assert plan.early_stopping.mode == ("min" if early == "loss" else "max")
            assert plan.early_stopping.patience == cfg.trainer.early_stopping.patience


def test_only_the_plan_multiplies_epochs_by_steps():
    """The run's length is computed in one place: no other module of the app or the callbacks multiplies a count
    of epochs by a count of steps (or the reverse)."""
    import re

    root = Path(__file__).resolve().parents[2] / "trainkit"
    product = re.compile(r"epochs?\w*\)?\s*\*\s*[\w.]*steps|steps\w*\)?\s*\*\s*[\w.]*epochs")
    found = [f"{path.relative_to(root)}: {line.strip()}"
             for folder in ("app", "callbacks") for path in sorted((root / folder).rglob("*.py"))
             if path.name != "plan.py"
             for line in path.read_text(encoding="utf-8").splitlines()
             if product.search(line) and not line.lstrip().startswith("#")]
    assert found == []
