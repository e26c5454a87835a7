"""Exact resume with augmentations on: image folders with RandomResizedCrop, flips, RandAugment, MixUp and CutMix
(data.augment=strong); a run resumed mid-epoch ends bitwise equal to the uninterrupted run, because
trainer.resume_data=exact replays the pipeline (and so every random draw of the augmentations) to the checkpoint.
The control: resume_data=fast skips the replay (MindSpore replays only the sampler), and the same resume ends
elsewhere -- the augmentations' draws matter, so the equality is not vacuous."""
import mindspore as ms
import numpy as np
import pytest

from tests.common.image_folders import write_folder
from trainkit.app import train
from trainkit.app.config import compose_config


def overrides(root, run_dir):
    return ["data=image_folder", f"data.root={root}", "data.image_size=8", "data.batch_size=4", "data.augment=strong",
            "data.num_parallel_workers=1", "model.width=4", "trainer.epochs=2", "trainer.eval_interval=0",
            "trainer.checkpoint_every_n_steps=1", "trainer.keep_checkpoints=20", "logger=quiet",
            f"run_dir={run_dir}"]


def parameters(network):
    return {p.name: p.asnumpy().copy() for p in network.get_parameters()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The folder (18 training images: 4 steps per epoch), run A's mid-epoch-2 checkpoint and final Parameters."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    tmp_path = tmp_path_factory.mktemp("augmented")
    root = write_folder(tmp_path / "images", {"cat": 10, "dog": 8, "emu": 6})
    whole = train(compose_config(overrides(root, tmp_path / "a")))
    checkpoint = tmp_path / "a" / "checkpoints" / "trainkit-2_2.ckpt"
    assert int(ms.load_checkpoint(str(checkpoint))["global_step"].asnumpy()) == 6
    return root, checkpoint, parameters(whole.wrapper)


def test_a_run_with_augmentations_resumed_mid_epoch_ends_bitwise_equal(graph_mode, uninterrupted, tmp_path):
    """Mutation caught: trainer.resume_data=fast for the resumed run (no replay: the augmentations draw anew and
    the weights differ) -- the control below."""
    root, checkpoint, final = uninterrupted
    resumed = train(compose_config([*overrides(root, tmp_path / "b"), f"trainer.resume={checkpoint}"]))
    differing = [name for name, value in parameters(resumed.wrapper).items() if not np.array_equal(value, final[name])]
    assert not differing, differing[:5]


@pytest.mark.slow
def test_without_the_replay_the_same_resume_ends_elsewhere(graph_mode, uninterrupted, tmp_path):
    root, checkpoint, final = uninterrupted
    fast = train(compose_config([*overrides(root, tmp_path / "c"), f"trainer.resume={checkpoint}",
                                 "trainer.resume_data=fast"]))
    assert any(not np.array_equal(value, final[name]) for name, value in parameters(fast.wrapper).items())
