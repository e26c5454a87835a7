"""MindSpore's compile cache under `python -m trainkit`: one folder per config, and a cached run is the same run.

MindSpore itself loaded a cache saved by a run without an EMA into a run with one (its EMA never moved), so the
key is what these tests guard: what shapes the graphs must change it, what does not must not.
"""
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from tests.common.kernels import seeded_cache
from trainkit.app import compile_cache
from trainkit.app.config import compose_config

REPO = Path(__file__).resolve().parents[2]
QUICK = ["recipe=digits_quickstart", "trainer.epochs=1", "logger.progress=off", "logger.tensorboard=false"]


def trainkit(*args, cwd, cache):
    if not cache.exists():
        seeded_cache(cache)  # this process's kernels: the run compiles graphs, not the C++ library (3 s)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), "TRAINKIT_CACHE_DIR": str(cache)}
    env.pop("TRAINKIT_COMPILE_CACHE", None)
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def last_checkpoint(run_dir: Path) -> dict:
    (path,) = sorted((run_dir / "checkpoints").glob("trainkit-*.ckpt"))
    return {name: value.asnumpy() for name, value in ms.load_checkpoint(str(path)).items() if hasattr(value, "asnumpy")}


def test_a_second_run_of_a_config_loads_its_graphs_and_trains_bit_for_bit_the_same(tmp_path):
    cache = tmp_path / "cache"
    first = trainkit(*QUICK, "hydra.run.dir=first", cwd=tmp_path, cache=cache)
    assert first.returncode == 0, first.stderr
    assert "compile cache:" in first.stdout and "a new config" in first.stdout
    (folder,) = (cache / "compile").iterdir()
    (shapes,) = [path for path in folder.iterdir() if path.is_dir()]  # the shapes the data gave the config
    assert list(shapes.rglob("*.mindir"))  # MindSpore saved the graphs there
    assert (shapes / "fit_check.json").exists()  # the fit check passed: the second run skips its forward pass

    no_ema = trainkit(*QUICK, "wrapper.ema_decay=null", "hydra.run.dir=no_ema", cwd=tmp_path, cache=cache)
    assert no_ema.returncode == 0, no_ema.stderr
    assert "a new config" in no_ema.stdout  # another graph: its own folder, never the first run's graphs
    assert len(list((cache / "compile").iterdir())) == 2

    second = trainkit(*QUICK, "hydra.run.dir=second", cwd=tmp_path, cache=cache)
    assert second.returncode == 0, second.stderr
    assert "graphs saved by an earlier run of this config" in second.stdout
    expected, got = last_checkpoint(tmp_path / "first"), last_checkpoint(tmp_path / "second")
    assert sorted(expected) == sorted(got) and any(name.startswith("ema") for name in got)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_the_key_follows_the_config_the_target_modules_and_named_files_but_not_the_run_directory(
        tmp_path, monkeypatch):
    def key(*overrides):
        return compile_cache.cache_key(compose_config([*QUICK, f"run_dir={tmp_path / 'run'}", *overrides]))

    base = key()
    assert key() == base
    assert compile_cache.cache_key(compose_config([*QUICK, f"run_dir={tmp_path / 'other'}"])) == base
    assert key("wrapper.ema_decay=0.9") != base
    assert key("data.batch_size=16") != base
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")  # the graphs would call MindSpore's kernels, not trainkit's
    assert key() != base
    monkeypatch.delenv("TRAINKIT_FUSED_KERNELS")
    assert key() == base

    project = tmp_path / "project"
    project.mkdir()
    (project / "user_net_for_cache.py").write_text("A = 1\n")
    monkeypatch.syspath_prepend(str(project))
    target = ["model._target_=user_net_for_cache.Net"]
    before = key(*target)
    (project / "user_net_for_cache.py").write_text("A = 2\n")  # the user edited their model
    assert key(*target) != before

    data_file = tmp_path / "table.csv"
    data_file.write_text("1,2\n")
    named = [f"+data.extra_file={data_file}"]
    before = key(*named)
    data_file.write_text("1,2,3\n")
    assert key(*named) != before


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_trainkit_compile_cache_0_turns_it_off(value, monkeypatch):
    monkeypatch.setenv("TRAINKIT_COMPILE_CACHE", value)
    assert compile_cache.cache_root() is None


def test_a_graph_mindspore_cannot_save_compiles_uncached_and_its_config_is_not_tried_again(tmp_path):
    cache = tmp_path / "cache"
    # A PyExecute node: the window's branch with dynamic scaling (Nesterov keeps MindSpore's optimizer, and so the
    # branch; the fused step's window has none, and its graphs save: test_an_accumulation_window_now_saves).
    unsavable = [*QUICK, "wrapper.accumulation_steps=2", "wrapper.loss_scale=dynamic", "optimizer=momentum",
                 "optimizer.use_nesterov=true"]
    first = trainkit(*unsavable, "hydra.run.dir=first", cwd=tmp_path, cache=cache)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    assert "compile cache: off for the rest of this run" in first.stdout
    (folder,) = (cache / "compile").iterdir()
    assert (folder / compile_cache.UNSAVABLE).exists()
    second = trainkit(*unsavable, "hydra.run.dir=second", cwd=tmp_path, cache=cache)
    assert second.returncode == 0, second.stderr
    assert "compile cache: off (MindSpore cannot save this config's graphs" in second.stdout
    expected, got = last_checkpoint(tmp_path / "first"), last_checkpoint(tmp_path / "second")
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_an_accumulation_window_now_saves(tmp_path):
    """The fused step's window has no branch, so no PyExecute node: accumulation with dynamic scaling, which
    MindSpore could not save before, loads its graphs on a second run and trains bit for bit the same."""
    cache = tmp_path / "cache"
    window = [*QUICK, "wrapper.accumulation_steps=2", "wrapper.loss_scale=dynamic"]
    first = trainkit(*window, "hydra.run.dir=first", cwd=tmp_path, cache=cache)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    assert "compile cache: off" not in first.stdout
    second = trainkit(*window, "hydra.run.dir=second", cwd=tmp_path, cache=cache)
    assert second.returncode == 0, second.stderr
    assert "graphs saved by an earlier run of this config" in second.stdout
    expected, got = last_checkpoint(tmp_path / "first"), last_checkpoint(tmp_path / "second")
    assert sorted(expected) == sorted(got)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("entry", [None, "/nonexistent/-c"])
def test_no_cache_where_mindspore_cannot_read_the_entry_script(entry, monkeypatch, tmp_path):
    """``python -c``, a notebook, a pytest-xdist worker: MindSpore's cache would crash the first compile parsing
    ``sys.argv[0]``, so trainkit leaves it off there."""
    from mindspore.graph import api

    monkeypatch.setattr(api, "entry_script_path", entry)
    monkeypatch.setattr(compile_cache, "_used_in_this_process", False)
    monkeypatch.setenv("TRAINKIT_CACHE_DIR", str(tmp_path))
    assert compile_cache.enable(compose_config(["run_dir=unused"])) is None
    assert not (tmp_path / "compile").exists()


def test_no_cache_in_a_data_parallel_worker(monkeypatch, tmp_path):
    """msrun's ranks would all write one folder at once: a rank crashed at exit in a sweep of 2-worker runs."""
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setattr(compile_cache, "_used_in_this_process", False)
    monkeypatch.setattr(compile_cache, "_entry_script_readable", lambda: True)
    monkeypatch.setenv("TRAINKIT_CACHE_DIR", str(tmp_path))
    assert compile_cache.enable(compose_config(["run_dir=unused"])) is None
    assert not (tmp_path / "compile").exists()


def test_the_key_is_what_the_config_resolves_to_not_how_it_is_spelled(tmp_path, monkeypatch):
    """Issue 30: the key was the unresolved config, so a value set through an interpolation
    (``${oc.env:...}``) reused the graphs of another value and trained bitwise equal to it (label smoothing 0.3
    trained as 0.0, exit 0). Mutation tried: ``resolve=False`` in cache_key (the two keys are equal)."""
    smoothing = ["loss.label_smoothing='${oc.decode:${oc.env:TKLS,0.0}}'", f"run_dir={tmp_path / 'run'}"]
    monkeypatch.setenv("TKLS", "0.0")
    spelled_zero = compile_cache.cache_key(compose_config([*QUICK, *smoothing]))
    assert spelled_zero == compile_cache.cache_key(compose_config([*QUICK, "loss.label_smoothing=0.0",
                                                                    f"run_dir={tmp_path / 'run'}"]))
    monkeypatch.setenv("TKLS", "0.3")
    assert compile_cache.cache_key(compose_config([*QUICK, *smoothing])) != spelled_zero


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, caplog):
    """A saved graph is code to MindSpore: a compile cache that another user can write is left off, saying so.
    Mutation tried: the unsafe_folder check removed from enable (the folder is used)."""
    from mindspore.graph import api

    monkeypatch.setattr(api, "entry_script_path", __file__)
    monkeypatch.setattr(compile_cache, "_used_in_this_process", False)
    monkeypatch.setattr(compile_cache, "_graphs_compiled_already", lambda: False)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TRAINKIT_CACHE_DIR", str(shared))
    with caplog.at_level("WARNING", logger="trainkit"):
        assert compile_cache.enable(compose_config([*QUICK, f"run_dir={tmp_path / 'run'}"])) is None
    assert "is writable by other users (mode 777)" in caplog.text and "compiles on every run" in caplog.text
    assert not ms.get_context("enable_compile_cache")


def test_values_that_reach_the_graphs_as_data_share_a_key_and_a_users_own_group_is_keyed_whole(tmp_path):
    """Issue 33: a sweep over the learning rate ran the same graphs under a new key per job. The rates are the
    values of the optimizer's ``learning_rate`` Parameter, so they are not keyed -- but only where trainkit knows
    that: under a user's optimizer or schedule the rate is keyed. Mutation tried: the target condition removed
    from graph_config (the user-schedule key stays equal)."""
    def key(*overrides):
        return compile_cache.cache_key(compose_config([*QUICK, f"run_dir={tmp_path / 'run'}", *overrides]))

    base = key()
    for data_only in ["optimizer.lr=0.05", "lr_schedule.warmup_epochs=0", "lr_schedule.min_lr=0.001",
                      "trainer.keep_checkpoints=1", "logger.log_every_n_steps=3", "trainer.eval_interval=2"]:
        assert key(data_only) == base, data_only
    for shaping in ["trainer.epochs=2", "trainer.seed=1", "optimizer.weight_decay=0.01", "optimizer.beta1=0.8",
                    "loss.label_smoothing=0.1", "wrapper.max_grad_norm=1.0"]:
        assert key(shaping) != base, shaping
    users_schedule = ["lr_schedule._target_=tests.app.test_compile_cache.linear_schedule"]
    assert key(*users_schedule, "optimizer.lr=0.05") != key(*users_schedule)
    assert key(*users_schedule, "lr_schedule.warmup_epochs=0") != key(*users_schedule)


def linear_schedule(lr, epochs, updates_per_epoch, warmup_epochs=0, min_lr=0.0):  # a user's schedule (above)
    return [lr] * int(epochs * updates_per_epoch)


def test_a_data_file_changed_under_the_same_size_and_time_never_gets_the_graphs_of_the_old_shapes(tmp_path):
    """The key sees a named file's size and time only: rewritten with one label more (4 classes, not 3) and its time
    set back, the table keys the same config folder. The network built for it has other shapes, so its graphs get
    a subfolder of their own and the run trains (with the 3-class graphs loaded it crashed in the loss kernel on a
    label read from the wrong memory). Mutation: compile_cache.settle as a no-op (red: the run fails)."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(100, 3))
    labels = (features[:, 0] > 0).astype(int) + (features[:, 1] > 0.5).astype(int)
    table = tmp_path / "t.csv"

    def write(labels):
        table.write_text("a,b,c,y\n" + "".join(f"{a:.4f},{b:.4f},{c:.4f},{y}\n"
                                                for (a, b, c), y in zip(features, labels)))
        os.utime(table, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))

    write(labels)
    size = table.stat().st_size
    args = ["recipe=wine_mlp", "data=table", f"data.path={table}", "data.target=y", "trainer.epochs=1",
            "logger.progress=off", "logger.tensorboard=false"]
    first = trainkit(*args, "hydra.run.dir=first", cwd=tmp_path, cache=tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    labels[np.flatnonzero(labels == 2)[0]] = 7  # one more class, the same number of characters
    write(labels)
    assert table.stat().st_size == size
    second = trainkit(*args, "hydra.run.dir=second", cwd=tmp_path, cache=tmp_path / "cache")
    assert second.returncode == 0, second.stderr
    assert "4 classes" in second.stdout and "a new config" in second.stdout
    (folder,) = (tmp_path / "cache" / "compile").iterdir()  # the same config key ...
    assert len([path for path in folder.iterdir() if path.is_dir()]) == 2  # ... and two sets of shapes


def test_another_class_count_with_every_split_size_kept_gets_a_shapes_folder_of_its_own(tmp_path, monkeypatch):
    """The same table file rewritten from 3 classes (40/30/30 rows) to 4 (40/30/20/10): the stratified split keeps
    70/10/20 rows, so the steps per epoch and the evaluation batch are the same, and only the network's output
    layer tells the two apart. settle must key the shapes subfolder by it. Mutation caught: settle describing the
    run without the network's parameter shapes (red: both land in one folder, the 4-class run loading the 3-class
    graphs)."""
    from trainkit.app import build

    root = tmp_path / "cache"
    monkeypatch.setenv("TRAINKIT_CACHE_DIR", str(root))
    monkeypatch.delenv("TRAINKIT_COMPILE_CACHE", raising=False)
    monkeypatch.setattr(ms, "set_context", lambda **kwargs: None)  # settle's folder is what is checked, not MindSpore
    config_folder = root / "compile" / "one-config-key"  # what enable() made of the config: the same for both
    config_folder.mkdir(parents=True)
    table = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    folders, sizes = [], []
    for counts in ([40, 30, 30], [40, 30, 20, 10]):
        labels = rng.permutation(np.repeat(np.arange(len(counts)), counts))
        table.write_text("a,b,y\n" + "".join(f"{a:.3f},{b:.3f},{y}\n" for (a, b), y in
                                             zip(rng.normal(size=(len(labels), 2)), labels)))
        cfg = compose_config(["recipe=wine_mlp", "data=table", f"data.path={table}", "data.target=y",
                              "run_dir=/unused", "+model.conv_impl=native"])
        data = build.instantiate_group("data", cfg.data)
        data.prepare()
        assert data.num_classes == len(counts)
        train_set, eval_set = data.train_dataset(), data.eval_dataset()
        sizes.append((train_set.get_dataset_size(), eval_set.get_dataset_size(), eval_set.output_shapes()))
        monkeypatch.setattr(compile_cache, "_active", config_folder)
        compile_cache.settle(build.build_model(cfg, data), train_set.get_dataset_size(), eval_set)
        folders.append(compile_cache.active_folder())
    assert sizes[0] == sizes[1]  # the premise: the data's sizes alone do not tell the runs apart
    assert all(folder.parent == config_folder and folder.is_dir() for folder in folders), folders
    assert folders[0] != folders[1]
