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
    assert {"trainkit.models.small_cnn.SmallCNN", "mindspore.nn.Adam", "trainkit.parts.lr_schedule.cosine"} <= named
    # and under the paths they had before 0.2, which runs stored then name (trainkit.lr_schedule.cosine)
    before_the_move = {name.replace("trainkit.parts.", "trainkit.", 1) for name in named
                       if name.startswith("trainkit.parts.")}
    assert before_the_move and named | before_the_move == set(shipped_targets())
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


@pytest.fixture
def mypkg(tmp_path, monkeypatch):
    """A user's package: ``mypkg.models.Net`` defined there, re-exported as ``mypkg.Net``; ``pathlib.Path`` imported."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pathlib import Path\nfrom mypkg.models import Net\n")
    (package / "models.py").write_text("import shutil\n\n\nclass Net:\n    def __init__(self, width=1):\n"
                                       "        self.width = width\n\n\ndef build():\n    return Net()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mypkg"
    import sys

    for name in [name for name in sys.modules if name == "mypkg" or name.startswith("mypkg.")]:
        del sys.modules[name]


@pytest.mark.parametrize("trusted, refused", [((), "mypkg.Net"), (("mypk",), "mypkg.Net"), (("mypkg",), None),
                                              (("mypkg.Net",), None), (("mypkg.Other",), "mypkg.Net")])
def test_trust_is_by_module_or_exact_target(trusted, refused, mypkg):
    cfg = OmegaConf.create({"model": {"_target_": "mypkg.Net"},
                           "loss": {"_target_": "trainkit.parts.losses.CrossEntropy"}})
    if refused is None:
        check_trusted(cfg, "FILE", trusted)
    else:
        with pytest.raises(ConfigError, match=f"FILE names model._target_={refused}, which is not trusted.*"
                                              "--trust mypkg$"):
            check_trusted(cfg, "FILE", trusted)


def test_targets_set_on_the_command_line_are_the_users():
    assert override_targets(["model._target_=mypkg.Net", "+data.x._target_=a.b", "trainer.epochs=2"]) == \
        ("mypkg.Net", "a.b")


@pytest.mark.parametrize("target", ["mypkg.Path.write_text", "mypkg.models.shutil.copyfile", "mypkg.Path",
                                    "mypkg.models.Net.__init__.__globals__", "mypkg.nothing_here"])
def test_trusting_a_module_trusts_what_it_defines_not_what_it_imports(mypkg, target):
    """Issue 30: ``--trust my_project`` trusted ``my_project.data.Path.write_text`` (pathlib's). Mutation tried: the
    prefix test alone in is_trusted (every target here passes)."""
    cfg = OmegaConf.create({"data": {"_target_": target}})
    with pytest.raises(ConfigError, match=f"names data._target_={target}, which is not a class or function mypkg "
                                          "defines"):
        check_trusted(cfg, "FILE", ["mypkg"])
    for defined in ("mypkg.models.Net", "mypkg.Net", "mypkg.models.build"):
        check_trusted(OmegaConf.create({"model": {"_target_": defined}}), "FILE", ["mypkg"])


def test_every_untrusted_target_is_named_at_once():
    cfg = OmegaConf.create({"model": {"_target_": "one.Net"}, "data": {"_target_": "two.sub.Data"},
                            "loss": {"_target_": "one.Loss"}})
    with pytest.raises(ConfigError, match=r"FILE names model._target_=one.Net and data._target_=two.sub.Data and "
                                          r"loss._target_=one.Loss, which are not trusted.*--trust one "
                                          r"--trust two.sub$"):
        check_trusted(cfg, "FILE")
