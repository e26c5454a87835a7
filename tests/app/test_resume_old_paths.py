"""A run stored before 0.2 names trainkit's parts by the paths they had then (``trainkit.losses.CrossEntropy``,
``trainkit.lr_schedule.cosine``): it resumes under the current config, which names them ``trainkit.parts.*``, since
the same target under its old path is no change; a target that really changed is still refused by name."""
import pytest
from mindspore import nn
from omegaconf import OmegaConf

from trainkit.app.config import compose_config
from trainkit.app.resume_policy import check_resumable
from trainkit.errors import ConfigError
from trainkit.rundir.checkpoint_file import Position, SavedCheckpoint, config_text

BASE = ["recipe=digits_quickstart", "run_dir=/tmp/unused"]


def stored_before_the_move(*overrides):
    text = config_text(compose_config([*BASE, *overrides])).replace("trainkit.parts.", "trainkit.")
    assert "_target_: trainkit.losses.CrossEntropy" in text and "_target_: trainkit.lr_schedule.cosine" in text
    return SavedCheckpoint(path="run/checkpoints/trainkit-1_3.ckpt", parameters={}, position=Position(3, 44),
                           skipped_steps=0, group_size=1, config=OmegaConf.create(text))


def test_a_run_stored_under_the_old_paths_resumes_under_the_new_ones():
    """Mutation caught: without resume_policy._same_target, "an exact resume needs the same loss, lr_schedule"."""
    check_resumable(stored_before_the_move(), compose_config(BASE), nn.Cell(), 44, 1)


def test_a_target_that_changed_is_still_refused_by_name():
    with pytest.raises(ConfigError, match=r"needs the same loss\b"):
        check_resumable(stored_before_the_move(), compose_config([*BASE, "loss=mse"]), nn.Cell(), 44, 1)
