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
