"""A resume never changes which samples are trained and evaluated on: every data key but the few that only decide
how fast samples arrive is refused, naming the key (``check_resumable`` against a checkpoint's stored config)."""
import pytest
from mindspore import nn
from omegaconf import OmegaConf

from trainkit.app.config import compose_config
from trainkit.app.resume_policy import check_resumable
from trainkit.errors import ConfigError
from trainkit.rundir.checkpoint_file import Position, SavedCheckpoint, config_text

BASE = ["recipe=digits_quickstart", "run_dir=/tmp/unused"]


def checkpoint_of(*overrides):
    config = OmegaConf.create(config_text(compose_config([*BASE, *overrides])))  # as a checkpoint stores it
    return SavedCheckpoint(path="run/checkpoints/trainkit-1_3.ckpt", parameters={},
                              position=Position(3, 44), skipped_steps=0, group_size=1, config=config)


@pytest.mark.parametrize("change", ["data.split_seed=3", "data.test_fraction=0.3", "+data.classes=[0,1]",
                                    "data.image_size=16", "data=wine"])
def test_a_data_key_that_may_change_the_samples_is_refused_by_name(change):
    with pytest.raises(ConfigError) as error:
        check_resumable(checkpoint_of(), compose_config([*BASE, change]), nn.Cell(), 44, 1)
    key = change.lstrip("+").split("=")[0]
    text = str(error.value)
    assert f"needs the same {key}" in text or (key == "data" and "needs the same data._target_" in text), text
    assert "which samples are trained and evaluated on" in text


def test_worker_counts_may_change_on_resume():
    check_resumable(checkpoint_of(), compose_config([*BASE, "data.num_parallel_workers=3"]), nn.Cell(), 44, 1)
