"""Class names: a data module's ``class_names`` reach the run directory and every checkpoint the app writes, and
:func:`load_class_names` reads them back from either (the contract ``trainkit.predict`` and ``trainkit.export`` use).
"""
import json

import mindspore as ms
import pytest
from mindspore import nn

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.data.tabular import SklearnTabularData
from trainkit.errors import DataError
from trainkit.rundir.checkpoint_file import save_checksummed
from trainkit.rundir.class_names import load_class_names, save_class_names

NAMES = ["barolo", "grignolino", "barbera"]


class NamedWine(SklearnTabularData):
    """scikit-learn's wine, its three cultivars named."""

    class_names = NAMES


def test_a_run_stores_its_class_names_in_the_run_and_in_every_checkpoint(graph_mode, tmp_path):
    """Mutations caught: build_callbacks dropping metadata= (the checkpoints lose the names: red); training.py not
    calling save_class_names (class_names.json missing: red)."""
    train(compose_config(["recipe=wine_mlp", "logger=quiet", f"run_dir={tmp_path}", "trainer.epochs=2",
                          "trainer.eval_interval=1", "lr_schedule=constant", f"data._target_={__name__}.NamedWine"]))
    assert json.loads((tmp_path / "class_names.json").read_text(encoding="utf-8")) == NAMES
    assert load_class_names(tmp_path) == NAMES
    checkpoints = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    assert "best.ckpt" in {p.name for p in checkpoints} and len(checkpoints) == 3  # best + one per epoch
    for path in checkpoints:
        assert json.loads(str(ms.load_checkpoint(str(path))["trainkit_class_names"])) == NAMES, path
        copied = tmp_path / "elsewhere" / path.name  # away from its run: the checkpoint's own entry
        copied.parent.mkdir(exist_ok=True)
        copied.write_bytes(path.read_bytes())
        assert load_class_names(copied) == NAMES
    resumed = train(compose_config(["recipe=wine_mlp", "logger=quiet", f"run_dir={tmp_path}", "trainer.epochs=3",
                                    "trainer.eval_interval=1", "lr_schedule=constant", "trainer.resume=auto",
                                    f"data._target_={__name__}.NamedWine"]))  # the entry does not upset a resume
    assert resumed.metrics["optimizer_steps"] > 0


def test_a_data_module_without_names_leaves_none(graph_mode, tmp_path):
    train(compose_config(["recipe=wine_mlp", "logger=quiet", f"run_dir={tmp_path}", "trainer.epochs=1"]))
    assert not (tmp_path / "class_names.json").exists()
    assert load_class_names(tmp_path) is None
    checkpoint, = (tmp_path / "checkpoints").glob("trainkit-*.ckpt")
    assert load_class_names(checkpoint) is None


def test_an_older_checkpoint_falls_back_to_its_run_directory(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    save_checksummed(nn.Dense(2, 3), tmp_path / "checkpoints" / "trainkit-1_1.ckpt")
    save_class_names(tmp_path, ["a", "b", "c"])
    assert load_class_names(tmp_path / "checkpoints" / "trainkit-1_1.ckpt") == ["a", "b", "c"]


def test_a_damaged_class_names_file_is_refused_naming_it(tmp_path):
    (tmp_path / "class_names.json").write_text('{"not": "a list"}', encoding="utf-8")
    with pytest.raises(DataError, match="class_names.json: the class names are not a JSON list of strings"):
        load_class_names(tmp_path)
