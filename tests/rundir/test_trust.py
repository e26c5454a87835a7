"""Which ``_target_``s a config read from a file may name (trainkit.rundir.trust), node by node."""
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from trainkit.errors import ConfigError
from trainkit.rundir.trust import check_trusted, override_targets, shipped_targets, targets


def test_trainkits_own_targets_are_those_its_shipped_configs_name():
    import trainkit

    named = set()
    for folder in ("configs", "recipes"):
        for path in (Path(trainkit.__file__).parent / folder).rglob("*.yaml"):
            named.update(line.split(":", 1)[1].strip() for line in path.read_text().splitlines()
                         if line.strip().startswith("_target_:"))
    assert {"trainkit.models.small_cnn.SmallCNN", "mindspore.nn.Adam", "trainkit.lr_schedule.cosine"} <= named
    assert named == set(shipped_targets())
    assert "pathlib.Path.write_text" not in shipped_targets()


def test_every_target_is_found_at_any_depth_and_through_interpolations():
    cfg = OmegaConf.create(yaml.safe_load("""
        run_dir: ${hydra:runtime.output_dir}
        model: {_target_: trainkit.models.mlp.MLP, act: {_target_: a.b, _partial_: true}}
        data: {_target_: x.y, _args_: [1, {_target_: p.q}], items: [[{_target_: deep.one}]]}
        made: '${oc.create:"{_target_: shutil.copyfile}"}'
        alias: ${model.act}
    """))
    assert sorted(target for _, target in targets(cfg)) == sorted(
        ["trainkit.models.mlp.MLP", "a.b", "x.y", "p.q", "deep.one", "shutil.copyfile", "a.b"])
    assert ("data._args_[1]._target_", "p.q") in list(targets(cfg))


@pytest.mark.parametrize("trusted, refused", [((), "mypkg.Net"), (("mypk",), "mypkg.Net"), (("mypkg",), None),
                                              (("mypkg.Net",), None), (("mypkg.Other",), "mypkg.Net")])
def test_trust_is_by_module_or_exact_target(trusted, refused):
    cfg = OmegaConf.create({"model": {"_target_": "mypkg.Net"}, "loss": {"_target_": "trainkit.losses.CrossEntropy"}})
    if refused is None:
        check_trusted(cfg, "FILE", trusted)
    else:
        with pytest.raises(ConfigError, match=f"FILE names model._target_={refused}, which is not trusted.*"
                                              "--trust mypkg$"):
            check_trusted(cfg, "FILE", trusted)


def test_targets_set_on_the_command_line_are_the_users():
    assert override_targets(["model._target_=mypkg.Net", "+data.x._target_=a.b", "trainer.epochs=2"]) == \
        ("mypkg.Net", "a.b")
