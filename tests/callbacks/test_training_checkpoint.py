"""An epoch's last step is checkpointed after the epoch's evaluation, never before it: a run killed between the two
must resume from the checkpoint before, redo the epoch's end and record its evaluation (a checkpoint at the epoch's
last step taken first resumed past an evaluation never recorded: seen once in four suite runs)."""
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from mindspore import nn

import trainkit.callbacks.training_checkpoint as training_checkpoint
from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint


class Recorder(PeriodicCheckpoint):
    def __init__(self, **kwargs):
        super().__init__(network=None, directory="unused", steps_per_epoch=5, **kwargs)
        self.saved_at = []

    def _save(self, in_background, copy=True):
        self.saved_at.append(self._step)


def context(step):
    args = SimpleNamespace(cur_step_num=step)
    return SimpleNamespace(original_args=lambda: args)


def run(checkpoint, steps=10):
    events = []
    for step in range(1, steps + 1):
        checkpoint.on_train_step_end(context(step))
        events += [("step end", s) for s in checkpoint.saved_at]
        checkpoint.saved_at.clear()
        if step % 5 == 0:
            checkpoint.on_train_epoch_end(context(step))
            events += [("epoch end", s) for s in checkpoint.saved_at]
            checkpoint.saved_at.clear()
    return events


def test_every_n_steps_leaves_an_epochs_last_step_to_the_epoch_end():
    assert run(Recorder(every_n_steps=5)) == [("epoch end", 5), ("epoch end", 10)]
    assert run(Recorder(every_n_steps=3)) == [("step end", 3), ("epoch end", 5), ("step end", 6), ("step end", 9),
                                              ("epoch end", 10)]


def test_without_epoch_end_saves_every_n_steps_saves_at_the_step():
    assert run(Recorder(every_n_steps=5, at_epoch_end=False)) == [("step end", 5), ("step end", 10)]


def test_an_epoch_end_save_leaves_its_fsync_and_pruning_to_a_thread(tmp_path, monkeypatch):
    """The epoch end returns while the new file's fsync is still running (the steps go on: fsync is most of a small
    model's save, bench row 4); the oldest checkpoint goes only after the new one is durable, and the train end waits
    for both. ``save()`` (a polite stop's) is durable when it returns.
    Mutations caught: the hook waiting for its fsync (the epoch end blocks: the test times out on `release`);
    pruning before the fsync; ``on_train_end`` not waiting; ``save()`` in the background."""
    durable, on_main_thread, release, started = [], [], threading.Event(), threading.Event()

    def slow_fsync(path):  # stands for a slow disk: blocks until the test releases it
        started.set()
        assert release.wait(timeout=20)
        durable.append(Path(path).name)
        on_main_thread.append(threading.current_thread() is threading.main_thread())

    monkeypatch.setattr(training_checkpoint, "make_durable", slow_fsync)
    checkpoint = PeriodicCheckpoint(nn.Dense(2, 2), tmp_path, steps_per_epoch=5, keep=1)
    release.set()
    checkpoint.on_train_epoch_end(context(5))
    checkpoint.wait()
    release.clear()
    started.clear()
    checkpoint.on_train_epoch_end(context(10))  # returns with the fsync blocked
    assert started.wait(timeout=20)
    names = sorted(path.name for path in tmp_path.glob("trainkit-*.ckpt"))
    assert names == ["trainkit-1_5.ckpt", "trainkit-2_5.ckpt"]  # the new one in place, the old one kept meanwhile
    assert durable == ["trainkit-1_5.ckpt"]
    release.set()
    checkpoint.on_train_end(None)
    assert durable == ["trainkit-1_5.ckpt", "trainkit-2_5.ckpt"]
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("trainkit-checkpoint")]
    assert sorted(path.name for path in tmp_path.glob("trainkit-*.ckpt")) == ["trainkit-2_5.ckpt"]
    checkpoint._step = 13
    path = checkpoint.save()  # on this thread: durable when it returns
    assert durable[-1] == path.name and on_main_thread[-1]
    assert on_main_thread[:2] == [False, False]


def test_a_background_save_writes_the_values_of_its_step_while_training_moves_on(tmp_path, monkeypatch):
    """The epoch's checkpoint is serialised on the callback's thread from a copy taken at the step; the writer is
    held until the Parameters have moved on. Mutation tried: the snapshot left out (the live Parameters written):
    the file held the later values."""
    import threading

    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint

    class Context:
        def __init__(self, step):
            self.step = step

        def original_args(self):
            return type("Params", (), {"cur_step_num": self.step})()

    network = nn.Dense(2, 3)
    at_step = {p.name: p.asnumpy().copy() for p in network.get_parameters()}
    moved_on = threading.Event()
    real_save = ms.save_checkpoint

    def held_save(*args, **kwargs):
        assert moved_on.wait(timeout=60)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ms, "save_checkpoint", held_save)
    callback = PeriodicCheckpoint(network, tmp_path, steps_per_epoch=1, keep=2)
    callback.on_train_begin(Context(0))
    callback.on_train_step_end(Context(1))
    callback.on_train_epoch_end(Context(1))
    for parameter in network.get_parameters():  # the next steps change the weights
        ops.assign(parameter, parameter + 1.0)
    moved_on.set()
    callback.wait()
    saved = ms.load_checkpoint(str(tmp_path / "trainkit-1_1.ckpt"))
    for name, value in at_step.items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value, err_msg=name)


def test_a_snapshot_writes_the_bytes_mindspores_save_of_the_cell_writes(tmp_path):
    """Every Parameter, named and ordered as ``mindspore.save_checkpoint(cell)`` has them (a wrapper with an EMA,
    an optimizer's moments, batch-norm statistics). Mutation tried: the snapshot in another order: red."""
    from mindspore import nn

    from trainkit import TrainingWrapper
    from trainkit.rundir.checkpoint_file import Position, parameter_snapshot, save_training_checkpoint

    network = nn.SequentialCell(nn.Dense(3, 4), nn.BatchNorm1d(4), nn.Dense(4, 2))
    loss = nn.WithLossCell(network, nn.MSELoss())
    wrapper = TrainingWrapper(loss, nn.Adam(network.trainable_params(), 0.01), ema_decay=0.9)
    kwargs = dict(skipped_steps=2, group_size=1, config_text="trainer: {}", durable=False)
    save_training_checkpoint(wrapper, tmp_path / "cell.ckpt", Position(3, 5), **kwargs)
    save_training_checkpoint(wrapper, tmp_path / "copy.ckpt", Position(3, 5), values=parameter_snapshot(wrapper),
                             **kwargs)
    assert (tmp_path / "copy.ckpt").read_bytes() == (tmp_path / "cell.ckpt").read_bytes()


def test_a_snapshot_of_a_cell_never_saved_writes_the_bytes_mindspores_save_writes(tmp_path):
    """A Cell whose Parameters hold no data yet (built under ``no_init_parameters``: made at the first use) is
    snapshotted as MindSpore's own save writes it. (Reading a Parameter initialises it too: the snapshot's
    ``init_parameters_data`` call, now made only where a Parameter has no data, is a belt to those braces.)"""
    import mindspore as ms
    from mindspore import nn
    from mindspore.nn.utils import no_init_parameters

    from trainkit.rundir.checkpoint_file import parameter_snapshot

    def fresh():
        ms.set_seed(3)
        with no_init_parameters():
            return nn.SequentialCell(nn.Dense(3, 4), nn.BatchNorm1d(4), nn.Dense(4, 2))

    snapshot_first = fresh()
    assert any(p.has_init for p in snapshot_first.get_parameters())
    ms.save_checkpoint(parameter_snapshot(snapshot_first), str(tmp_path / "copy.ckpt"))
    ms.save_checkpoint(fresh(), str(tmp_path / "cell.ckpt"))
    assert (tmp_path / "copy.ckpt").read_bytes() == (tmp_path / "cell.ckpt").read_bytes()


def test_the_apps_checkpoints_store_the_config_as_its_run_directory_does(tmp_path):
    """The YAML made once for .hydra/config.yaml is the one every checkpoint stores: the resolved config."""
    import mindspore as ms
    from omegaconf import OmegaConf

    from trainkit.app import train
    from trainkit.app.config import compose_config

    cfg = compose_config([f"run_dir={tmp_path}", "trainer.epochs=2", "logger.progress=off", "trainer.test=false"])
    train(cfg)
    expected = OmegaConf.to_yaml(cfg, resolve=True)
    assert (tmp_path / ".hydra" / "config.yaml").read_text(encoding="utf-8") == expected
    checkpoints = sorted((tmp_path / "checkpoints").glob("trainkit-*.ckpt"))
    assert len(checkpoints) == 2
    for path in checkpoints:
        assert ms.load_checkpoint(str(path), choice_func=lambda name: name == "trainkit_config")[
            "trainkit_config"] == expected


def test_the_last_epochs_checkpoint_is_written_from_the_parameters_before_the_hook_returns(tmp_path, monkeypatch):
    """Of a train call's epochs (a resumed one: epochs 3 and 4 of 4), the earlier epoch's checkpoint is serialised
    from a copy on the callback's thread; the last epoch's, which no step follows and the train end waits for at
    once, from the Parameters themselves, written when the hook returns, with the values of its step. Mutation
    caught: the last epoch copied like the others (``copy=True`` always): the snapshot count is 2."""
    import mindspore as ms
    import numpy as np
    from mindspore import ops

    snapshots = []
    real_snapshot = training_checkpoint.parameter_snapshot

    def counted_snapshot(network):
        snapshots.append(network)
        return real_snapshot(network)

    monkeypatch.setattr(training_checkpoint, "parameter_snapshot", counted_snapshot)

    def at(step, epoch):
        args = SimpleNamespace(cur_step_num=step, cur_epoch_num=epoch, epoch_num=2)  # Model.train(4, initial_epoch=2)
        return SimpleNamespace(original_args=lambda: args)

    network = nn.Dense(2, 3)
    callback = PeriodicCheckpoint(network, tmp_path, steps_per_epoch=1, keep=5)
    callback.on_train_begin(at(2, 3))
    callback.on_train_epoch_begin(at(2, 3))
    callback.on_train_step_end(at(3, 3))
    callback.on_train_epoch_end(at(3, 3))
    assert len(snapshots) == 1
    callback.on_train_epoch_begin(at(3, 4))
    for parameter in network.get_parameters():  # epoch 4's step
        ops.assign(parameter, parameter + 1.0)
    at_step = {p.name: p.asnumpy().copy() for p in network.get_parameters()}
    callback.on_train_step_end(at(4, 4))
    callback.on_train_epoch_end(at(4, 4))
    assert len(snapshots) == 1
    saved = ms.load_checkpoint(str(tmp_path / "trainkit-4_1.ckpt"))  # in place when the hook returned
    for name, value in at_step.items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value, err_msg=name)
    callback.on_train_end(at(4, 4))
    assert sorted(path.name for path in tmp_path.glob("trainkit-*.ckpt")) == ["trainkit-3_1.ckpt", "trainkit-4_1.ckpt"]


def test_the_old_name_of_the_periodic_checkpoint_callback_still_works_with_a_deprecation_warning():
    import trainkit.callbacks.training_checkpoint as module

    with pytest.warns(DeprecationWarning, match="now PeriodicCheckpoint; the old name is removed in 0.3.0"):
        assert module.TrainingCheckpoint is PeriodicCheckpoint
