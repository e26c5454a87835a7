"""Issue 33's safety test: every config key the compile cache treats as not shaping the graphs
(``compile_cache.GRAPH_DATA_KEYS``) is run with graphs that a run with another value of it compiled, and must train
bit for bit as a run that compiled its own.

Per key, three processes: a two-job sweep ``-m key=A,B`` with an empty cache (job 0 compiles and saves its graphs
to disk; job 1 trains the cells job 0 compiled, in the same process), ``key=B`` alone (loads job 0's graphs from
disk), and ``key=B`` with the cache off. The final state of the train step's every Parameter (weights, optimizer
moments and step, EMA, counters) is compared bitwise. The learning rate is the fast representative; the other keys
are slow-marked.

Mutations tried: ``"loss.label_smoothing": None`` added to GRAPH_DATA_KEYS (with a row below): red, the shared
and the loaded run train with the first job's smoothing; ``assign_in_place`` in graph_reuse.reuse replaced by
``set_data``: red, job 1 crashes (the train graph's control flow keeps the old ``global_step``); the test-set
evaluation's restore (app/testing.py) back to ``set_data``: red, the shared job's EMA never moves.
"""
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import pytest

from tests.common.kernels import seeded_cache
from trainkit.app import compile_cache

REPO = Path(__file__).resolve().parents[2]
QUICK = ["recipe=digits_quickstart", "trainer.epochs=1", "logger.progress=off", "logger.tensorboard=false",
         "+callbacks=[{_target_: tests.app.test_compile_cache_safety.SaveFinalParameters}]"]

# key of GRAPH_DATA_KEYS: (the override tried, other overrides of all three runs, the first job's value, the value
# compared). Values chosen so that the two runs differ in what the key does.
TRIED = {
    "optimizer.lr": ("optimizer.lr", [], "0.01", "0.03"),
    "lr_schedule.warmup_epochs": ("lr_schedule.warmup_epochs", [], "1", "0"),
    "lr_schedule.min_lr": ("lr_schedule.min_lr", [], "0.0", "0.004"),
    "lr_schedule.milestones": ("lr_schedule.milestones", ["lr_schedule=step", "trainer.epochs=2"], "[1]", "[2]"),
    "lr_schedule.gamma": ("lr_schedule.gamma", ["lr_schedule=step", "trainer.epochs=2", "lr_schedule.milestones=[1]"],
                          "0.1", "0.5"),
    "trainer.eval_interval": ("trainer.eval_interval", ["trainer.epochs=2"], "1", "2"),
    "trainer.save_checkpoints": ("trainer.save_checkpoints", [], "true", "false"),
    "trainer.keep_checkpoints": ("trainer.keep_checkpoints", ["trainer.epochs=2"], "3", "1"),
    "trainer.checkpoint_every_n_steps": ("trainer.checkpoint_every_n_steps", [], "0", "10"),
    "trainer.best_metric": ("trainer.best_metric", [], "accuracy", "loss"),
    "trainer.best_mode": ("trainer.best_mode", ["trainer.best_metric=loss"], "auto", "max"),
    "trainer.early_stopping": ("trainer.early_stopping.patience",
                               ["trainer.epochs=2", "trainer.early_stopping.metric=loss"], "3", "1"),
    "trainer.max_nonfinite_steps": ("trainer.max_nonfinite_steps", [], "10", "2"),
    "logger": ("logger.log_every_n_steps", [], "10", "3"),
}


class SaveFinalParameters(ms.train.Callback):
    """Saves the train step's Parameters at the end of each run of the process, to ``$TK_FINAL-<n>.ckpt``."""

    runs = 0

    def on_train_end(self, run_context):
        path = f"{os.environ['TK_FINAL']}-{type(self).runs}.ckpt"
        ms.save_checkpoint(run_context.original_args().train_network, path)
        type(self).runs += 1


def trainkit(*args, cwd, cache, final, on=True):
    if not cache.exists():
        seeded_cache(cache)  # this process's kernels: the run compiles graphs, not the C++ library (3 s)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), "TRAINKIT_CACHE_DIR": str(cache),
           "TK_FINAL": str(final), "TRAINKIT_COMPILE_CACHE": "1" if on else "0"}
    result = subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def parameters(path: Path) -> dict:
    return {name: value.asnumpy() for name, value in ms.load_checkpoint(str(path)).items() if hasattr(value, "asnumpy")}


def assert_bitwise_equal(got: dict, expected: dict, what: str):
    assert sorted(got) == sorted(expected), what
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, f"{what}: {name}"
        assert got[name].tobytes() == value.tobytes(), f"{what}: {name} differs"


def check_key(key: str, tmp_path: Path):
    override, base, first, compared = TRIED[key]
    cache = tmp_path / "cache"
    sweep = trainkit("-m", *QUICK, *base, f"{override}={first},{compared}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=tmp_path, cache=cache, final=tmp_path / "sweep")
    assert "a new config: compiling and saving" in (tmp_path / "sweep" / "0" / "train.log").read_text(), sweep.stdout
    assert "graph sharing: this job runs the graphs the last job compiled" in \
        (tmp_path / "sweep" / "1" / "train.log").read_text()
    loaded = trainkit(*QUICK, *base, f"{override}={compared}", "hydra.run.dir=loaded", cwd=tmp_path, cache=cache,
                      final=tmp_path / "loaded")
    assert "graphs saved by an earlier run of this config" in loaded.stdout
    trainkit(*QUICK, *base, f"{override}={compared}", "hydra.run.dir=compiled", cwd=tmp_path, cache=cache,
             final=tmp_path / "compiled", on=False)
    expected = parameters(tmp_path / "compiled-0.ckpt")
    assert_bitwise_equal(parameters(tmp_path / "sweep-1.ckpt"), expected, f"{key}: the sweep's second job")
    assert_bitwise_equal(parameters(tmp_path / "loaded-0.ckpt"), expected, f"{key}: graphs loaded from disk")


def test_every_key_left_out_of_the_graph_key_has_a_value_to_try():
    assert sorted(TRIED) == sorted(compile_cache.GRAPH_DATA_KEYS)


def test_a_learning_rate_sweep_shares_graphs_and_trains_bit_for_bit_as_runs_that_compile(tmp_path):
    check_key("optimizer.lr", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(set(TRIED) - {"optimizer.lr"}))
def test_every_key_left_out_of_the_graph_key_trains_bit_for_bit_with_shared_graphs(key, tmp_path):
    check_key(key, tmp_path)


def test_a_seed_sweep_shares_graphs_and_each_seed_trains_bit_for_bit_as_a_run_that_compiles(tmp_path):
    """``trainer.seed`` is out of the in-process sharing key (not the on-disk cache's): the quick start's seed
    reaches its graphs only as the starting weights and data order. Mutation tried: the weights of a job of
    another seed not copied into the kept cells: red (bitwise)."""
    cache = tmp_path / "cache"
    trainkit("-m", *QUICK, "trainer.seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, cache=cache,
             final=tmp_path / "sweep")
    assert "graph sharing: this job runs the graphs the last job compiled" in \
        (tmp_path / "sweep" / "1" / "train.log").read_text()
    trainkit(*QUICK, "trainer.seed=1", "hydra.run.dir=compiled", cwd=tmp_path, cache=cache,
             final=tmp_path / "compiled", on=False)
    assert_bitwise_equal(parameters(tmp_path / "sweep-1.ckpt"), parameters(tmp_path / "compiled-0.ckpt"),
                         "trainer.seed=1: the sweep's second job")
