"""Behaviours the docs promise that had no test: each one run here as a user would meet it.

* the finiteness check counts finite gradients whose float32 sum overflows as an overflow (docs/wrapper.md);
* ``trainer.resume_data=fast`` continues with the same samples in the same order;
* each resume mismatch the docs list is named in its message, a harmless difference is logged and allowed;
* a ``-m`` sweep stops at its bad job, after the earlier ones ran;
* ``parallel=hybrid_parallel`` trains on CPU, and SIGTERM or Ctrl-C on the launcher stops every process of the job
  (with a non-zero status; how gracefully is the launcher's business).
"""
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from omegaconf import OmegaConf

from tests.common.callbacks import read_jsonl
from tests.common.cifar10_files import write_cifar10
from tests.common.kernels import needs_compiler
from tests.common.models import LinearLoss
from tests.common.processes import processes_mentioning
from trainkit import TrainingWrapper
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
FLOAT32_MAX = float(np.finfo(np.float32).max)


# ------------------------------------------------------------------- the finiteness check
@pytest.mark.parametrize("compute_grad_norm", [False, True], ids=["sum", "norm"])
def test_finite_gradients_whose_sum_overflows_float32_are_skipped_without_the_kernels(graph_mode, compute_grad_norm,
                                                                                     monkeypatch):
    """MindSpore's kernels (no C++ compiler): a float32 sum (or sum of squares) that overflows counts as not finite."""
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    x = np.array([[1.5e38, 1.5e38, 1.5e38, 1.0]], np.float32)
    assert np.all(np.isfinite(x)) and x.astype(np.float64).sum() > FLOAT32_MAX  # each finite, the sum not
    assert abs(x.astype(np.float64) @ [1.0, -1.0, 1.0, -1.0]) < FLOAT32_MAX / 2  # the loss is finite
    assert train_on(x, compute_grad_norm) == ([True, False], 1)  # only the small batch was applied


@needs_compiler
@pytest.mark.parametrize("compute_grad_norm", [False, True], ids=["check", "norm"])
def test_with_the_kernels_finite_gradients_are_skipped_only_when_their_norm_passes_float32(graph_mode,
                                                                                          compute_grad_norm):
    """The norm kernel sums the squares in double: gradients each finite whose float32 sum overflows (norm 2.6e38)
    are applied; a norm beyond float32's 3.4e38 is not finite."""
    within = np.array([[1.5e38, 1.5e38, 1.5e38, 1.0]], np.float32)
    assert np.sqrt((within.astype(np.float64) ** 2).sum()) < FLOAT32_MAX
    assert train_on(within, compute_grad_norm, check_weights=False) == ([False, False], 2)
    beyond = np.array([[3e38, 3e38, 0.0, 1.0]], np.float32)
    assert np.sqrt((beyond.astype(np.float64) ** 2).sum()) > FLOAT32_MAX
    assert train_on(beyond, compute_grad_norm) == ([True, False], 1)


def train_on(x: np.ndarray, compute_grad_norm: bool, check_weights: bool = True) -> tuple:
    """The guard's answers for batch `x` then a small one (SGD, lr 0.01), and how many steps were applied."""
    loss_net = LinearLoss([[1.0, -1.0, 1.0, -1.0]])  # loss x @ w: finite here
    optimizer = nn.SGD(loss_net.trainable_params(), learning_rate=0.01)
    wrapper = TrainingWrapper(loss_net, optimizer, skip_nonfinite=True, compute_grad_norm=compute_grad_norm)
    wrapper.set_train()
    small = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    overflows = [bool(wrapper(ms.Tensor(batch))[1].asnumpy()) for batch in (x, small)]
    if check_weights and overflows[0]:  # only the small batch was applied
        np.testing.assert_allclose(loss_net.dense.weight.asnumpy(), [[1.0, -1.0, 1.0, -1.0]] - 0.01 * small,
                                   rtol=1e-6)
    return overflows, int(optimizer.global_step.asnumpy())


# ------------------------------------------------------------------- resume
STEPS_PER_EPOCH = 5  # 40 training records in batches of 8


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar10")
    write_cifar10(str(root), train_per_file=10, test_records=8, seed=7)
    return root


def overrides(root, *more):
    return ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", f"data.root={root}", "data.val_fraction=0.2",
            "data.image_size=8",
            "data.batch_size=8", "data.augment=false", "data.num_parallel_workers=1", "trainer.epochs=2",
            "trainer.eval_interval=0", "trainer.checkpoint_every_n_steps=1", "trainer.keep_checkpoints=10",
            "logger=quiet", *more]


@pytest.fixture(scope="module")
def uninterrupted(cifar10, tmp_path_factory):
    """Two epochs without stopping, a checkpoint after every micro-batch; returns the run dir and final weights."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result = train(compose_config([*overrides(cifar10), f"run_dir={run_dir}"]))
    return run_dir, {p.name: p.asnumpy().copy() for p in result.wrapper.get_parameters()}


def test_resume_data_fast_continues_with_the_same_samples_in_the_same_order(uninterrupted, cifar10, tmp_path,
                                                                             caplog):
    run_a, final_a = uninterrupted
    source = run_a / "checkpoints" / "trainkit-1_3.ckpt"
    with caplog.at_level(logging.INFO, logger="trainkit"):
        result = train(compose_config([*overrides(cifar10), f"run_dir={tmp_path}", f"trainer.resume={source}",
                                       "trainer.resume_data=fast"]))
    assert "resuming from" in caplog.text and "replaying the data pipeline" not in caplog.text
    final = {p.name: p.asnumpy() for p in result.wrapper.get_parameters()}
    assert sorted(final) == sorted(final_a)
    differing = [name for name in final_a if not np.array_equal(final[name], final_a[name])]
    assert not differing, differing[:5]


def rewrite_group_size(source: Path, target: Path, group_size: int, root_now: Optional[Path] = None) -> None:
    """A copy of `source` as a job of `group_size` processes would have written it (and, given `root_now`, as if
    its run had read the data from there: other files behind the same data.root)."""
    saved = ms.load_checkpoint(str(source))
    appended = {key: saved.pop(key) for key in ("micro_steps", "steps_per_epoch", "skipped_steps", "group_size",
                                                 "trainkit_config", "kernel_path", "data_order", "trainkit_parts")
                if key in saved}
    append = {key: (value if isinstance(value, str) else int(value.asnumpy().item()))
              for key, value in appended.items()}
    append["group_size"] = group_size
    if root_now is not None:
        config = OmegaConf.create(append["trainkit_config"])
        config.data.root = str(root_now)
        append["trainkit_config"] = OmegaConf.to_yaml(config)
    ms.save_checkpoint([{"name": name, "data": value} for name, value in saved.items()], str(target),
                       append_dict=append, crc_check=True)  # with its CRC32, as trainkit writes


@pytest.mark.parametrize("change, named", [
    (["data.batch_size=4"], "data.batch_size: 8 in the checkpoint, 4 now"),
    (["data.image_size=16"], "data.image_size: 8 in the checkpoint, 16 now"),
    (["optimizer=momentum"], "optimizer._target_: 'mindspore.nn.Adam' in the checkpoint, 'mindspore.nn.Momentum'"),
    (["lr_schedule=cosine"], "lr_schedule._target_: 'trainkit.parts.lr_schedule.constant' in the checkpoint"),
    (["trainer.seed=1"], "trainer.seed: 0 in the checkpoint, 1 now"),
    (["OTHER_ROOT"], "an exact resume needs the same data.root (a data key decides which samples are trained"),
    (["OTHER_DATA"], "has 5 steps per epoch and this run 10: the training data differs"),
    (["OTHER_DP_SIZE"], "was written by a data-parallel job of 2 processes and this one has 1"),
], ids=["batch_size", "image_size", "optimizer", "schedule", "seed", "other_root", "other_data", "dp_size"])
def test_each_resume_mismatch_is_named_and_stops_before_anything_is_written(uninterrupted, cifar10, tmp_path,
                                                                            change, named):
    run_a, _ = uninterrupted
    source = run_a / "checkpoints" / "trainkit-1_3.ckpt"
    root = cifar10
    if change in (["OTHER_ROOT"], ["OTHER_DATA"]):  # twice the records: the checkpoint's position means other samples
        root = tmp_path / "other"
        write_cifar10(str(root), train_per_file=20, test_records=8, seed=8)  # 80 train
        if change == ["OTHER_DATA"]:  # the files replaced behind the same data.root
            source = tmp_path / "same_root.ckpt"
            rewrite_group_size(run_a / "checkpoints" / "trainkit-1_3.ckpt", source, 1, root_now=root)
        change = []
    elif change == ["OTHER_DP_SIZE"]:
        source, change = tmp_path / "two_processes.ckpt", []
        rewrite_group_size(run_a / "checkpoints" / "trainkit-1_3.ckpt", source, 2)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        train(compose_config([*overrides(root), f"run_dir={run_dir}", f"trainer.resume={source}", *change]))
    assert named in str(error.value) and str(source) in str(error.value)
    assert not (run_dir / ".hydra").exists() and not (run_dir / "checkpoints").exists()


def test_a_harmless_difference_is_logged_and_allowed(uninterrupted, cifar10, tmp_path, caplog):
    run_a, final_a = uninterrupted
    source = run_a / "checkpoints" / "trainkit-2_3.ckpt"
    with caplog.at_level(logging.INFO, logger="trainkit"):
        result = train(compose_config([*overrides(cifar10), f"run_dir={tmp_path}", f"trainer.resume={source}",
                                       "logger.log_every_n_steps=2", "trainer.keep_checkpoints=3"]))
    assert "logger.log_every_n_steps was 10 in the checkpoint, now 2" in caplog.text
    assert result.metrics["optimizer_steps"] == 2 * STEPS_PER_EPOCH
    assert all(np.array_equal(p.asnumpy(), final_a[p.name]) for p in result.wrapper.get_parameters())


# ------------------------------------------------------------------- the command line
def trainkit(*args, cwd, **kwargs):
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_sweep_stops_at_its_bad_job_after_the_earlier_ones_ran(cifar10, tmp_path):
    process = trainkit("-m", *overrides(cifar10), "trainer.epochs=1", "trainer.save_checkpoints=false",
                       "wrapper.accumulation_steps=1,0,1", cwd=tmp_path)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr[-3000:]
    assert "trainkit: error: wrapper.accumulation_steps=0 is not valid" in stderr
    (sweep,) = (tmp_path / "multirun" / "resnet50_cifar10").iterdir()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]  # job 2 never started
    assert [r["step"] for r in read_jsonl(sweep / "0" / "metrics.jsonl") if "train/loss" in r] == [5]
    assert not (sweep / "1" / "metrics.jsonl").exists() and not (sweep / "1" / ".hydra" / "config.yaml").exists()


@pytest.mark.parametrize("stop", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow),  # 19 s; SIGTERM to a
                                  signal.SIGINT],  # launcher: tests/distributed/test_launch.py's SIGTERM test
                         ids=["sigterm", "ctrl_c"])
def test_hybrid_parallel_trains_on_cpu_and_a_signal_to_the_launcher_stops_every_process(cifar10, tmp_path, stop):
    run_dir = tmp_path / "run"
    launcher = trainkit(*overrides(cifar10, "data.batch_size=4", "trainer.epochs=500", "trainer.save_checkpoints=false",
                                   "logger.log_every_n_steps=1", "parallel=hybrid_parallel", "parallel.workers=2",
                                   f"hydra.run.dir={run_dir}"), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        records = []
        while not records and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if (run_dir / "metrics.jsonl").exists():
                records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
        assert records and launcher.poll() is None, "the job did not start training"
        workers = [pid for pid, cmdline in processes_mentioning(str(run_dir)) if pid != launcher.pid]
        assert len(workers) >= 3  # msrun, its scheduler and two workers (at least)
        launcher.send_signal(stop)  # Ctrl-C: the terminal sends SIGINT to the launcher (msrun has its own session)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert not processes_mentioning(str(run_dir)), stderr[-2000:]
    log = (run_dir / "train.log").read_text()
    assert "hybrid_parallel: 2 worker(s)" in log and "(4 per rank x 2)" in log  # one job of two ranks
    assert "(4 per rank x 2)" in (run_dir / "msrun_logs" / "worker_1.log").read_text()
