"""data=image_folder without training: the splits test_fraction=0 leaves, and the start-up line's image size."""
import numpy as np
import pytest

from tests.common.image_folders import write_folder, write_image
from trainkit.data.image_folder import ImageFolderData

COUNTS = {"cat": 10, "dog": 8, "emu": 6}


def test_test_fraction_zero_carves_no_test_split_and_no_test_runs(tmp_path):
    """data.test_fraction=0 (a test set kept elsewhere): every image trains or validates, no test split, and the
    app's trainer.test finds none (null: no test; true: one line). A test/ folder is still used.

    Mutations caught: test_fraction=0 refused (as it was); at least one image per class carved for a test split
    anyway (max(1, ...)); has_test_set ignored by wants_test (the app asks test_dataset() for nothing)."""
    from omegaconf import OmegaConf

    from trainkit.app.testing import wants_test
    from trainkit.errors import ConfigError

    root = write_folder(tmp_path / "images", COUNTS)
    data = ImageFolderData(root, image_size=8, val_fraction=0.2, test_fraction=0, num_parallel_workers=1)
    data.prepare()
    assert not data.has_test_set
    counts = {split: np.bincount(data.split_labels(split), minlength=3) for split in ("train", "val")}
    np.testing.assert_array_equal(counts["val"], [round(0.2 * n) for n in (10, 8, 6)])
    np.testing.assert_array_equal(counts["train"] + counts["val"], [10, 8, 6])
    with pytest.raises(ConfigError, match="no test split"):
        data.test_dataset()
    config = OmegaConf.create({"trainer": {"test": None, "evaluate": True}, "parallel": {"mode": "stand_alone"}})
    assert wants_test(config, data) is False
    config.trainer.test = True
    with pytest.raises(ConfigError, match=r"holds no test split here \(data.test_fraction=0\)"):
        wants_test(config, data)
    write_folder(tmp_path / "split" / "train", {"cat": 4, "dog": 4})
    write_folder(tmp_path / "split" / "test", {"cat": 2, "dog": 1}, seed=2)
    kept = ImageFolderData(tmp_path / "split", image_size=8, test_fraction=0, num_parallel_workers=1)
    kept.prepare()
    assert kept.has_test_set and wants_test(config, kept) and len(kept.split_labels("test")) == 3
    for bad in (-0.1, 1.0, True):
        with pytest.raises(ConfigError, match=r"test_fraction must be a number in \[0, 1\)"):
            ImageFolderData(root, test_fraction=bad)
    with pytest.raises(ConfigError, match=r"val_fraction must be a number in \(0, 1\)"):
        ImageFolderData(root, val_fraction=0)


def test_the_start_up_line_states_the_image_size_and_warns_when_image_size_is_far(tmp_path, caplog):
    """The median width and height of the images (all of them here: fewer than the sample), and a warning when
    data.image_size is more than 2x or less than 0.5x their median shorter side.

    Mutations caught: the mean instead of the median (the 400 px image moves it); width and height swapped; the
    ratio taken against the longer side (2x the shorter side + 1 is about 1.3x the longer: not warned)."""
    import logging

    rng = np.random.default_rng(7)
    sizes = [(int(rng.integers(30, 50)), int(rng.integers(55, 70))) for _ in range(11)] + [(400, 420)]
    for index, (width, height) in enumerate(sizes):
        write_image(tmp_path / "images" / ("cat" if index % 2 else "dog") / f"{index}.png", rng, size=(height, width))
    widths, heights = np.array(sizes).T
    shorter = int(np.median(np.minimum(widths, heights)))
    expected = f"images {int(np.median(widths))}x{int(np.median(heights))} (median of 12, width x height)"
    for image_size, warned in ((2 * shorter, False), (2 * shorter + 1, True), (shorter // 2, False),
                               (shorter // 2 - 1, True), (224, True)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trainkit"):
            ImageFolderData(tmp_path / "images", image_size=max(8, image_size), num_parallel_workers=1).prepare()
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("image folder ")]
        assert line.endswith(expected), line
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == warned, (image_size, warnings)
        if warned:
            assert warnings[0].startswith(f"data.image_size={image_size} is ") and f"{shorter} px" in warnings[0]
