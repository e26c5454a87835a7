"""Exact resume on data held in memory (digits, one batch a pipeline row: trainkit.data.array_batches): resumed
mid-epoch 2 from a checkpoint of the uninterrupted run, the run ends with every Parameter bitwise the uninterrupted
run's. Each epoch's order is drawn by (seed, epoch), so the replay must reach epoch 2's order, not epoch 1's again."""
import numpy as np
import pytest

from trainkit.app import train
from trainkit.app.config import compose_config

COMMON = ["trainer.epochs=3", "data.val_fraction=0.4", "data.test_fraction=0.4", "data.batch_size=64",
          "trainer.checkpoint_every_n_steps=1", "trainer.keep_checkpoints=100", "trainer.test=false",
          "logger.progress=off"]


@pytest.mark.parametrize("resume_data", ["exact", "fast"])
def test_a_resume_mid_epoch_on_in_memory_data_ends_bitwise_the_uninterrupted_run(tmp_path, resume_data):
    """``fast``: MindSpore skips into the epoch without running the source's earlier passes, so the training set is
    its own row-by-row shuffle there (mutation caught: array_batches without that fallback)."""
    common = [*COMMON, f"trainer.resume_data={resume_data}"]
    whole = train(compose_config([*common, f"run_dir={tmp_path / 'whole'}"]))
    steps = int(whole.metrics["optimizer_steps"]) // 3
    assert steps >= 3
    middle = tmp_path / "whole" / "checkpoints" / f"trainkit-2_{steps - 1}.ckpt"  # epoch 2, its last batch to go
    resumed = train(compose_config([*common, f"run_dir={tmp_path / 'resumed'}", f"trainer.resume={middle}"]))
    expected = {p.name: p.asnumpy() for p in whole.wrapper.get_parameters()}
    got = {p.name: p.asnumpy() for p in resumed.wrapper.get_parameters()}
    assert got.keys() == expected.keys()
    differing = [name for name in expected if not np.array_equal(got[name], expected[name])]
    assert not differing, f"{len(differing)} of {len(expected)} differ, e.g. {differing[:5]}"


def test_a_resume_into_another_order_mid_epoch_is_said(tmp_path, caplog):
    """A checkpoint written mid-epoch under one order (trainer.resume_data=exact: array_batches' permutations),
    resumed under the other (fast: MindSpore's sampler), logs what differs and how to continue in the checkpoint's
    order; at an epoch's end nothing is said (the next epoch is whole either way)."""
    import logging

    whole = train(compose_config([*COMMON, "trainer.epochs=2", f"run_dir={tmp_path / 'whole'}"]))
    steps = int(whole.metrics["optimizer_steps"]) // 2
    checkpoints = tmp_path / "whole" / "checkpoints"
    fast = [*COMMON, "trainer.epochs=2", "trainer.resume_data=fast"]
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        train(compose_config([*fast, f"run_dir={tmp_path / 'end'}",
                              f"trainer.resume={checkpoints}/trainkit-1_{steps}.ckpt"]))
    assert "leaves out others" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        train(compose_config([*fast, f"run_dir={tmp_path / 'mid'}", f"trainer.resume={checkpoints}/trainkit-2_1.ckpt"]))
    assert "was written mid-epoch with the training order drawn by trainkit.data.array_batches" in caplog.text
    assert "the rest of epoch 2 repeats some samples and leaves out others" in caplog.text
    assert "resume with trainer.resume_data=exact to continue in the checkpoint's order" in caplog.text


def test_a_checkpoint_of_mindsporess_order_resumed_mid_epoch_under_trainkits_says_how_to_continue(tmp_path, caplog):
    """As a checkpoint written before array_batches (MindSpore's row shuffle: here trainer.resume_data=fast, whose
    training set is that pipeline) resumed by the default run: the warning names resume_data=fast."""
    import logging

    whole = train(compose_config([*COMMON, "trainer.epochs=2", "trainer.resume_data=fast",
                                  f"run_dir={tmp_path / 'whole'}"]))
    assert int(whole.metrics["optimizer_steps"]) >= 4
    middle = tmp_path / "whole" / "checkpoints" / "trainkit-1_1.ckpt"
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        train(compose_config([*COMMON, "trainer.epochs=2", f"run_dir={tmp_path / 'mid'}", f"trainer.resume={middle}"]))
    assert "the training order drawn by mindspore.dataset's sampler" in caplog.text
    assert "the rest of epoch 1 repeats some samples" in caplog.text
    assert "resume with trainer.resume_data=fast to continue in the checkpoint's order" in caplog.text
