"""NonFiniteStop: N consecutive skipped updates stop the run naming the step, after saving the last good state."""
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore import dtype as mstype
from mindspore.train import RunContext

from tests.common.callbacks import Params, Snapshots
from tests.common.cifar10_files import write_cifar10
from tests.common.models import TinyMLP, batches, loss_network
from trainkit import TrainingWrapper
from trainkit.callbacks import NonFiniteStop
from trainkit.errors import TrainingError

REPO = Path(__file__).resolve().parents[2]
BATCH = 3


def dataset(bad_steps, count):
    data = batches(count, BATCH, seed=3)
    xs = np.stack([x for x, _ in data])
    for step in bad_steps:  # 1-based
        xs[step - 1, 0, 0] = np.nan
    return ms.dataset.NumpySlicesDataset({"x": xs, "y": np.stack([y for _, y in data])}, shuffle=False)


@pytest.mark.parametrize("k", [1, 2])
def test_stops_after_consecutive_skipped_updates_and_saves_the_last_good_state(mode, k, tmp_path):
    # Updates (windows) 1-2 good, 3-4 bad, 5 good (resets the count), 6-8 bad: the limit of 3 is reached at
    # the end of window 8. With k=2 the NaN sits in each bad window's second micro-batch.
    bad_windows, limit, windows = [3, 4, 6, 7, 8], 3, 10
    net = TinyMLP(batch_norm=True)
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.05)
    wrapper = TrainingWrapper(loss_network(net), optimizer, accumulation_steps=k, ema_decay=0.5,
                              skip_nonfinite=True)
    saved = []

    def save_checkpoint():
        path = tmp_path / f"saved_{len(saved)}.ckpt"
        ms.save_checkpoint(wrapper, str(path))
        saved.append(path)
        return path

    states = Snapshots(every_step=True)
    stop = NonFiniteStop(limit, save_checkpoint=save_checkpoint)
    data = dataset([w * k for w in bad_windows], windows * k)
    with pytest.raises(TrainingError) as error:
        ms.train.Model(wrapper).train(1, data, callbacks=[states, stop], dataset_sink_mode=False)
    stop_step = 8 * k
    assert f"training stopped at step {stop_step} (epoch 1): 3 consecutive updates (steps {6 * k} to {stop_step})" \
           in str(error.value)
    assert "trainer.max_nonfinite_steps" in str(error.value) and str(saved[0]) in str(error.value)
    assert max(states.by_step) == stop_step  # nothing ran after the error
    assert len(saved) == 1
    # the saved state is the one after the last applied update (window 5): weights, moments, EMA, statistics
    last_good = states.by_step[5 * k]
    checkpoint = ms.load_checkpoint(str(saved[0]))
    for name, value in last_good.items():
        if name.startswith(("_window_start.", "_grad_sum.", "_loss_sum")):
            continue  # the guard's copy at the start of the current window, the window sums its start overwrites
        np.testing.assert_array_equal(checkpoint[name].asnumpy(), value, err_msg=name)
    assert int(checkpoint["global_step"].asnumpy()) == 3  # windows 1, 2 and 5


def step_end(stop, overflow, step, micro_step=None):
    network = Params(accumulation_steps=1 if micro_step is None else 2,
                     micro_step=None if micro_step is None else Tensor(micro_step, mstype.int32))
    outputs = (Tensor(0.5), Tensor(overflow), Tensor(1.0), Tensor(0.0))
    params = Params(net_outputs=outputs, cur_step_num=step, cur_epoch_num=1, batch_num=100, train_network=network)
    stop.on_train_step_end(RunContext(params))


def test_micro_steps_inside_a_window_do_not_reset_the_count():
    stop = NonFiniteStop(2)
    step_end(stop, True, 2, micro_step=0)   # window 1 skipped
    step_end(stop, False, 3, micro_step=1)  # first micro-batch of window 2: not an applied update
    with pytest.raises(TrainingError, match=r"step 4 \(epoch 1\): 2 consecutive updates \(steps 2 to 4\)"):
        step_end(stop, True, 4, micro_step=0)


def test_an_applied_update_resets_the_count_and_nothing_is_saved_without_a_saver():
    stop = NonFiniteStop(2)
    step_end(stop, True, 1)
    step_end(stop, False, 2)
    step_end(stop, True, 3)
    assert stop.consecutive == 1
    with pytest.raises(TrainingError, match="nothing was saved"):
        step_end(stop, True, 4)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_the_limit_must_be_a_positive_int(limit):
    with pytest.raises(ValueError, match="max_consecutive must be an int >= 1"):
        NonFiniteStop(limit)


def test_a_diverging_run_stops_with_exit_status_1_and_leaves_the_last_good_state(tmp_path):
    """Through the CLI: a learning rate of 1e38 makes every update after the first non-finite."""
    root = tmp_path / "cifar10"
    write_cifar10(str(root), train_per_file=10, test_records=8)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "trainkit", "recipe=resnet50_cifar10", "model=small_cnn", "model.width=4",
         "data.image_size=8", "data.batch_size=8", "data.num_parallel_workers=1", f"data.root={root}",
         "data.val_fraction=0.2",
         "trainer.epochs=2", "optimizer=momentum", "optimizer.lr=1e38", "trainer.max_nonfinite_steps=3",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 1, result.stderr
    assert ("trainkit: error: training stopped at step 4 (epoch 1): 3 consecutive updates (steps 2 to 4) were "
            "skipped") in result.stderr
    last_good = run_dir / "checkpoints" / "trainkit-1_4.ckpt"  # a training checkpoint, at the stopping step
    assert f"the last good state was saved to {last_good}" in result.stderr
    saved = ms.load_checkpoint(str(last_good))
    assert int(saved["global_step"].asnumpy()) == 1  # the one applied update
    assert int(saved["micro_steps"].asnumpy()) == 4
    assert all(np.all(np.isfinite(p.asnumpy())) for p in saved.values()
               if not isinstance(p, str) and p.dtype == ms.float32)
    assert "training stopped at step 4" in (run_dir / "train.log").read_text()


def test_with_the_limit_off_a_diverging_run_goes_on_and_counts_its_skipped_updates(graph_mode, tmp_path):
    from tests.common.callbacks import read_jsonl
    from trainkit.app import train
    from trainkit.app.config import compose_config

    root = tmp_path / "cifar10"
    write_cifar10(str(root), train_per_file=10, test_records=8)
    result = train(compose_config([
        "recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", "data.image_size=8", "data.batch_size=8",
        "data.num_parallel_workers=1", f"data.root={root}", "data.val_fraction=0.2",
        "trainer.epochs=2", "optimizer=momentum",
        "optimizer.lr=1e38", "trainer.max_nonfinite_steps=0", "logger.progress=off", "logger.log_every_n_steps=1",
        f"run_dir={tmp_path / 'run'}"]))
    assert not any(isinstance(cb, NonFiniteStop) for cb in result.callbacks)
    assert result.metrics["optimizer_steps"] == 1 and result.metrics["skipped_steps"] == 9
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["train/skipped_steps"] for r in records if "train/skipped_steps" in r] == list(range(10))
    assert all(np.all(np.isfinite(p.asnumpy())) for p in result.wrapper.get_parameters())


def test_config_default_and_a_bad_limit(tmp_path):
    from trainkit.app.config import check_config, compose_config
    from trainkit.errors import ConfigError

    cfg = compose_config([f"run_dir={tmp_path}"])
    assert cfg.trainer.max_nonfinite_steps == 10 and cfg.wrapper.skip_nonfinite is True
    bad = compose_config(["trainer.max_nonfinite_steps=-2", f"run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"trainer.max_nonfinite_steps=-2 is not valid"):
        check_config(bad)
