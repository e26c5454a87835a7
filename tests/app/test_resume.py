"""Exact resume, crash safety and checkpoint checks, end to end on generated CIFAR-10 (graph mode, CPU).

One uninterrupted run (A) saves a checkpoint after every micro-batch; resumed runs -- from A's mid-epoch,
mid-accumulation-window checkpoints, and after a SIGKILL -- must end with every Parameter of the
TrainingWrapper (weights, batch-norm statistics, optimizer moments and step, loss scale and its counter,
``_grad_sum``, EMA shadows and their count) bitwise equal to A's: MindSpore's CPU kernels are deterministic
here, so nothing looser is needed. Random crops and flips are on, so the data position is checked too.
"""
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint
from trainkit.errors import ConfigError, DataError
from trainkit.rundir.checkpoint_file import Position, checkpoint_files, newest_valid_checkpoint

STEPS_PER_EPOCH, EPOCHS = 5, 3  # 40 training records in batches of 8
TOTAL = STEPS_PER_EPOCH * EPOCHS
FEATURES = ["wrapper.accumulation_steps=2", "wrapper.ema_decay=0.9", "wrapper.ema_warmup=true",
            "wrapper.loss_scale=dynamic", "wrapper.loss_scale_value=1024", "wrapper.scale_window=3",
            "wrapper.max_grad_norm=0.5"]


def overrides(root):
    return ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", f"data.root={root}", "data.val_fraction=0.2",
            "data.image_size=8",
            "data.batch_size=8", "data.num_parallel_workers=1", f"trainer.epochs={EPOCHS}", "trainer.eval_interval=0",
            "trainer.checkpoint_every_n_steps=1", f"trainer.keep_checkpoints={TOTAL}", "logger.progress=off",
            "logger.log_every_n_steps=1", *FEATURES]


@pytest.fixture(scope="module")
def uninterrupted(tiny_cifar10, tmp_path_factory):
    """Run A: all epochs without stopping; returns its run directory and final wrapper Parameters."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result = train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}"]))
    return run_dir, parameters(result.wrapper)


def parameters(network):
    return {p.name: p.asnumpy().copy() for p in network.get_parameters()}


def checkpoint_arrays(path):
    return {name: value.asnumpy() for name, value in ms.load_checkpoint(str(path)).items()
            if not isinstance(value, str)}


def assert_identical(actual, expected):
    assert sorted(actual) == sorted(expected)
    differing = [name for name in expected if not np.array_equal(actual[name], expected[name])]
    assert not differing, f"{len(differing)} of {len(expected)} differ, e.g. {differing[:5]}"


def tree_digest(folder: Path):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name, done", [("trainkit-1_5.ckpt", 5), ("trainkit-2_2.ckpt", 7)],
                         ids=["epoch_end_mid_window", "mid_epoch_mid_window"])
def test_resume_ends_bitwise_equal_to_the_uninterrupted_run(uninterrupted, tiny_cifar10, tmp_path, name, done):
    run_a, final_a = uninterrupted
    source = run_a / "checkpoints" / name
    saved = ms.load_checkpoint(str(source))
    # The checkpoint really is inside an accumulation window: one micro-batch summed, not yet applied.
    assert int(saved["micro_step"].asnumpy()) == done % 2 == 1
    assert any(np.abs(saved[k].asnumpy()).sum() > 0 for k in saved if k.startswith("_grad_sum."))
    assert int(saved["global_step"].asnumpy()) == done // 2

    result = train(compose_config([*overrides(tiny_cifar10), f"run_dir={tmp_path}", f"trainer.resume={source}"]))

    assert_identical(parameters(result.wrapper), final_a)
    assert result.metrics["optimizer_steps"] == TOTAL // 2
    # Step numbering continues: the resumed run records steps done+1 .. TOTAL, then checkpoints at the same names.
    from tests.common.callbacks import read_jsonl
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(done + 1, TOTAL + 1))
    assert checkpoint_files(tmp_path / "checkpoints")[-1].name == f"trainkit-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt"


def test_sigkill_then_resume_auto_skips_a_broken_newest_checkpoint_and_ends_identical(uninterrupted, tiny_cifar10,
                                                                                       tmp_path):
    run_a, final_a = uninterrupted
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "trainkit", *overrides(tiny_cifar10), f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, GLOG_v="3")
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(checkpoint_files(run_dir / "checkpoints")) < 4 and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate()
    assert process.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    files = checkpoint_files(run_dir / "checkpoints")
    assert 4 <= len(files) < TOTAL, "the run was not killed mid-training"

    newest = files[-1]  # a crash while writing it: truncated
    os.chmod(newest, 0o600)
    newest.write_bytes(newest.read_bytes()[:200])
    resumed = subprocess.run([*command, "trainer.resume=auto"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert f"skipping checkpoint {newest}" in log
    assert f"resuming from {files[-2]}" in log

    final = run_dir / "checkpoints" / f"trainkit-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt"
    expected = checkpoint_arrays(run_a / "checkpoints" / final.name)
    assert_identical(checkpoint_arrays(final), expected)
    assert_identical({k: v for k, v in expected.items() if k in final_a}, final_a)
    assert (run_dir / ".hydra" / "config.yaml").exists() and (run_dir / ".hydra" / "resume-1" / "config.yaml").exists()


def test_resume_auto_in_a_new_directory_starts_a_new_run(tiny_cifar10, tmp_path):
    result = train(compose_config([*overrides(tiny_cifar10), f"run_dir={tmp_path}", "trainer.resume=auto",
                                   "trainer.epochs=1", "trainer.keep_checkpoints=2"]))
    assert result.metrics["optimizer_steps"] == STEPS_PER_EPOCH // 2
    assert [p.name for p in checkpoint_files(tmp_path / "checkpoints")] == ["trainkit-1_4.ckpt", "trainkit-1_5.ckpt"]


def test_resuming_from_an_older_checkpoint_of_the_run_moves_the_later_ones_aside(uninterrupted, tiny_cifar10,
                                                                                 tmp_path):
    import shutil

    run_a, final_a = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(run_a, run_dir)
    later = [p.name for p in checkpoint_files(run_dir / "checkpoints")][12:]
    source = run_dir / "checkpoints" / "trainkit-3_2.ckpt"
    result = train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}", f"trainer.resume={source}"]))
    assert_identical(parameters(result.wrapper), final_a)
    aside = list((run_dir / "checkpoints").glob("superseded-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == sorted(later)


def unique_tensor(path):
    """The largest float tensor of checkpoint `path` whose bytes occur once in the file: (offset, length)."""
    content = path.read_bytes()
    arrays = sorted((value.asnumpy() for value in ms.load_checkpoint(str(path)).values()
                     if not isinstance(value, str) and value.asnumpy().dtype == np.float32), key=lambda a: -a.nbytes)
    for array in arrays:
        offset = content.find(array.tobytes())
        if offset > 0 and content.find(array.tobytes(), offset + 1) < 0:
            return offset, array.nbytes
    raise AssertionError("no tensor stored once")


def damage(path, how):
    content = bytearray(path.read_bytes())
    if how == "flip_100_bytes_of_a_tensor":
        offset, length = unique_tensor(path)
        for index in np.random.default_rng(0).choice(length, 100, replace=False):
            content[offset + index] ^= 0xFF
    elif how == "0xff_over_a_tensor":  # 4000 bytes where the tensor holds that many: NaN weights, framing intact
        offset, length = unique_tensor(path)
        content[offset:offset + min(length, 4000)] = b"\xff" * min(length, 4000)
    elif how == "4000_bytes_of_0xff":
        content[len(content) // 3:len(content) // 3 + 4000] = b"\xff" * 4000
    else:  # non-finite weights in a file whose checksum is right: the state itself is what cannot go on
        saved = ms.load_checkpoint(str(path))
        appended = {name: saved.pop(name) for name in list(saved) if isinstance(saved[name], str)}
        name = max((n for n in saved if saved[n].asnumpy().dtype == np.float32), key=lambda n: saved[n].asnumpy().size)
        values = saved[name].asnumpy().copy()
        values.flat[3] = np.nan
        saved[name] = ms.Parameter(ms.Tensor(values), name=name)
        ms.save_checkpoint([{"name": n, "data": v} for n, v in saved.items()], str(path), append_dict=appended,
                           crc_check=True)
        return
    path.write_bytes(bytes(content))


@pytest.mark.parametrize("how, reason", [("flip_100_bytes_of_a_tensor", "fails its CRC32 checksum"),
                                         ("0xff_over_a_tensor", "fails its CRC32 checksum"),
                                         ("4000_bytes_of_0xff", "is corrupt"),
                                         ("non_finite_weights", "holds non-finite values")])
def test_a_damaged_newest_checkpoint_is_skipped_named_and_the_resume_ends_identical(uninterrupted, tiny_cifar10,
                                                                                    tmp_path, caplog, how, reason):
    """The run stopped after step 8; its newest checkpoint was damaged on disk: resume=auto says so, continues from
    the one before and ends bitwise as the uninterrupted run. Mutations tried: ``crc_check=False`` in
    ``load_checkpoint_file`` (the flipped tensor loads: red; 0xFF over a tensor is caught as non-finite instead:
    red on the reason), the non-finite check removed (the NaN state loads: red)."""
    run_a, final_a = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(run_a, run_dir)
    files = checkpoint_files(run_dir / "checkpoints")
    for later in files[8:]:
        later.unlink()
    newest, previous = files[7], files[6]
    damage(newest, how)
    with caplog.at_level(logging.INFO, logger="trainkit"):
        result = train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}", "trainer.resume=auto"]))
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1 and f"skipping checkpoint {newest}" in skipped[0] and reason in skipped[0], skipped
    assert f"resuming from {previous}: epoch 2, step 2 of 5" in caplog.text
    assert_identical(parameters(result.wrapper), final_a)


# ------------------------------------------------------------------- bad input
@pytest.mark.parametrize("change, message", [
    (["wrapper.accumulation_steps=1"], "wrapper.accumulation_steps: 2 in the checkpoint, 1 now"),
    (["model.width=8"], "model.width: 4 in the checkpoint, 8 now"),
    (["trainer.epochs=4", "lr_schedule=cosine"], "changes the learning rate of updates already taken"),
    (["wrapper.ema_decay=null", "trainer.best_metric=accuracy"], None),
], ids=["accumulation_steps", "model", "epochs_and_schedule", "no_ema"])
def test_a_checkpoint_from_a_different_config_stops_naming_the_difference_and_changes_nothing(
        uninterrupted, tiny_cifar10, tmp_path, change, message):
    import shutil

    run_a, _ = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(run_a, run_dir)
    (run_dir / "checkpoints" / f"trainkit-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt").unlink()  # so there is work left
    before = tree_digest(run_dir)
    with pytest.raises(ConfigError) as error:
        train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}", "trainer.resume=auto", *change]))
    if message is None:  # EMA turned off: clipping etc. may change, but the parameters no longer fit
        assert "not in this run's network: ema." in str(error.value)
    else:
        assert message in str(error.value)
    assert tree_digest(run_dir) == before


@pytest.mark.parametrize("held", [0, -1, 3])
def test_a_checkpoint_whose_window_place_contradicts_its_progress_is_refused(uninterrupted, tiny_cifar10, tmp_path,
                                                                              held):
    """A file with a right checksum whose ``micro_step`` is not its micro-batches done modulo k (someone else's,
    or edited) resumed with exit 0 and shifted every later window. Mutation caught: the check removed."""
    run_a, _ = uninterrupted
    source = checkpoint_files(run_a / "checkpoints")[6]  # 7 micro-batches done, k = 2: micro-batch 1 of its window
    saved = ms.load_checkpoint(str(source))
    assert int(saved["micro_step"].asnumpy()) == 1
    appended = {name: saved.pop(name) for name in list(saved) if isinstance(saved[name], str)}
    saved["micro_step"] = ms.Parameter(ms.Tensor(np.int32(held)), name="micro_step")
    planted = tmp_path / source.name
    ms.save_checkpoint([{"name": n, "data": v} for n, v in saved.items()], str(planted), append_dict=appended,
                       crc_check=True)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=f"holds micro_step {held}, but 7 micro-batches done") as error:
        train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}", f"trainer.resume={planted}"]))
    assert str(planted) in str(error.value) and "micro-batch 1 of its window" in str(error.value)
    assert not (run_dir / "checkpoints").exists()


def test_a_checkpoint_of_another_model_names_the_parameters_that_do_not_fit(tiny_cifar10, tmp_path):
    from mindspore import nn

    other = tmp_path / "other.ckpt"
    ms.save_checkpoint(nn.Dense(3, 2), str(other), append_dict={"micro_steps": 2, "steps_per_epoch": 5})
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}", f"trainer.resume={other}"]))
    text = str(error.value)
    assert str(other) in text and "missing from the checkpoint:" in text and "not in this run's network: weight" in text
    assert not (run_dir / ".hydra").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("content, message", [(b"", "is corrupt"), (b"\x00garbage" * 40, "is corrupt"),
                                              (None, "does not exist")])
def test_a_missing_or_corrupt_checkpoint_is_named(tiny_cifar10, tmp_path, content, message):
    path = tmp_path / "broken.ckpt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message) as error:
        train(compose_config([*overrides(tiny_cifar10), f"run_dir={tmp_path / 'run'}", f"trainer.resume={path}"]))
    assert str(path) in str(error.value)
    assert not (tmp_path / "run" / ".hydra").exists()


def test_a_finished_run_has_nothing_to_resume(uninterrupted, tiny_cifar10, tmp_path):
    run_a, _ = uninterrupted
    with pytest.raises(ConfigError, match="at the end of the run"):
        train(compose_config([*overrides(tiny_cifar10), f"run_dir={tmp_path}", f"trainer.resume={run_a}"]))


# ------------------------------------------------------------------- retention
class _Context:
    def __init__(self, step):
        self.step = step

    def original_args(self):
        return type("Params", (), {"cur_step_num": self.step})()


def test_retention_keeps_the_newest_k_and_a_failed_save_deletes_nothing(tmp_path, monkeypatch):
    from mindspore import nn

    callback = PeriodicCheckpoint(nn.Dense(2, 2), tmp_path, steps_per_epoch=4, every_n_steps=1, keep=2)
    callback.on_train_begin(_Context(0))
    for step in range(1, 6):
        callback.on_train_step_end(_Context(step))
        if step % 4 == 0:  # as Model.train calls it: an epoch's last step is saved at its end
            callback.on_train_epoch_end(_Context(step))
    callback.wait()  # the latest save's fsync and pruning run on the callback's thread; the train end waits too
    assert [p.name for p in checkpoint_files(tmp_path)] == ["trainkit-1_4.ckpt", "trainkit-2_1.ckpt"]

    def crash(*args, **kwargs):  # the process dies while writing: MindSpore leaves at most its temporary file
        Path(args[1]).with_suffix(".tmp").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ms, "save_checkpoint", crash)
    callback.on_train_step_end(_Context(6))  # written on the callback's thread
    with pytest.raises(KeyboardInterrupt):
        callback.wait()
    assert [p.name for p in checkpoint_files(tmp_path)] == ["trainkit-1_4.ckpt", "trainkit-2_1.ckpt"]
    found = newest_valid_checkpoint(tmp_path)
    assert found.path.name == "trainkit-2_1.ckpt" and found.position.micro_steps == 5


def test_positions_name_files_by_epoch_in_progress_and_step_in_it():
    assert Position(0, 5).file_name() == "trainkit-1_0.ckpt"
    assert Position(3, 5).file_name() == "trainkit-1_3.ckpt"
    assert Position(5, 5).file_name() == "trainkit-1_5.ckpt"
    assert Position(6, 5).file_name() == "trainkit-2_1.ckpt"
    assert (Position(7, 5).epoch, Position(7, 5).step_in_epoch) == (1, 2)


# ------------------------------------------------------------------- continuing a finished run for longer
def with_epochs(root, epochs, *extra):
    return [o for o in overrides(root) if not o.startswith("trainer.epochs=")] + [f"trainer.epochs={epochs}", *extra]


def test_a_finished_run_continues_for_longer_when_the_past_learning_rates_stay(uninterrupted, tiny_cifar10, tmp_path):
    """2 epochs, then trainer.epochs=3 with resume=auto (constant schedule: every update taken keeps its rate) ends
    bitwise equal to the 3-epoch run; the same with a cosine schedule, which a third epoch would stretch, is refused
    naming the keys, before anything is written."""
    _, final_a = uninterrupted
    run_dir = tmp_path / "run"
    train(compose_config([*with_epochs(tiny_cifar10, 2), f"run_dir={run_dir}"]))
    with pytest.raises(ConfigError, match="at the end of the run"):  # the same length: nothing left
        train(compose_config([*with_epochs(tiny_cifar10, 2), f"run_dir={run_dir}", "trainer.resume=auto"]))

    result = train(compose_config([*with_epochs(tiny_cifar10, EPOCHS), f"run_dir={run_dir}", "trainer.resume=auto"]))
    assert_identical(parameters(result.wrapper), final_a)

    # The same checkpoint as if its run had used a cosine schedule over 2 epochs: a third epoch changes every rate.
    source = run_dir / "checkpoints" / f"trainkit-2_{STEPS_PER_EPOCH}.ckpt"
    saved = ms.load_checkpoint(str(source))
    cosine = compose_config([*with_epochs(tiny_cifar10, 2, "lr_schedule=cosine"), f"run_dir={run_dir}"])
    from omegaconf import OmegaConf
    append = {k: saved.pop(k) for k in ("micro_steps", "steps_per_epoch", "skipped_steps", "group_size",
                                       "trainkit_config", "kernel_path", "data_order", "trainkit_parts") if k in saved}
    append = {k: v if isinstance(v, str) else int(v.asnumpy()) for k, v in append.items()}
    append["trainkit_config"] = OmegaConf.to_yaml(cosine, resolve=True)
    cosine_run = tmp_path / "cosine"
    (cosine_run / "checkpoints").mkdir(parents=True)
    ms.save_checkpoint([{"name": k, "data": v} for k, v in saved.items()],  # with its CRC32, as trainkit writes
                       str(cosine_run / "checkpoints" / source.name), append_dict=append, crc_check=True)
    before = tree_digest(cosine_run)
    with pytest.raises(ConfigError) as error:
        train(compose_config([*with_epochs(tiny_cifar10, EPOCHS, "lr_schedule=cosine"), f"run_dir={cosine_run}",
                              "trainer.resume=auto"]))
    assert "trainer.epochs: 2 in the checkpoint, 3 now" in str(error.value)
    assert "changes the learning rate of updates already taken" in str(error.value)
    assert tree_digest(cosine_run) == before


def test_a_checkpoint_whose_stored_schedule_names_an_untrusted_target_is_refused(uninterrupted, tiny_cifar10,
                                                                                  tmp_path):
    """A resume that compares schedules builds the checkpoint's own: a planted one is refused, and runs nothing.
    Mutation tried: the check_trusted call in check_resumable removed (the planted file is written)."""
    from omegaconf import OmegaConf

    run_a, _ = uninterrupted
    source = run_a / "checkpoints" / "trainkit-2_2.ckpt"
    saved = ms.load_checkpoint(str(source))
    config = OmegaConf.create(saved.pop("trainkit_config"))
    victim = tmp_path / "x.pth"
    config.lr_schedule = {"_target_": "pathlib.Path.write_text", "_args_": [str(victim), "import os"]}
    planted = tmp_path / "planted" / "trainkit-2_2.ckpt"
    planted.parent.mkdir()
    ms.save_checkpoint([{"name": k, "data": v} for k, v in saved.items() if not isinstance(v, str)], str(planted),
                       crc_check=True, append_dict={"trainkit_config": OmegaConf.to_yaml(config)})
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="lr_schedule._target_=pathlib.Path.write_text, which is not trusted"):
        train(compose_config([*overrides(tiny_cifar10), f"run_dir={run_dir}", f"trainer.resume={planted}",
                              f"trainer.epochs={EPOCHS + 1}"]))
    assert not victim.exists()
    assert not (run_dir / ".hydra").exists()
