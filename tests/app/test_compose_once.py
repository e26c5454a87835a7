"""A run's config is composed once (trainkit.app.compose_once), and is the config Hydra's two compositions give.

The reference is Hydra itself: the same steps (``Hydra.get_mode``, then the RUN composition ``Hydra.run`` makes) with
Hydra's loader as shipped. Mutations tried: the held config handed over without ``hydra.mode=RUN`` applied (red:
the hydra node differs), handed over whatever the overrides (red: the second case's learning rate), the fallback
for sweep overrides removed (red: get_mode raised instead of returning Hydra's mode), ``once()`` taken out of the
command (red: two compositions).
"""
import pytest
from hydra import initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf

from trainkit.app.compose_once import once
from trainkit.app.config import CONFIG_MODULE, register_configs


@pytest.fixture
def hydra_app():
    register_configs()
    with initialize_config_module(CONFIG_MODULE, version_base=None):
        yield GlobalHydra.instance().hydra


@pytest.fixture
def compositions(monkeypatch):
    count = [0]
    original = ConfigLoaderImpl._load_configuration_impl

    def counted(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl", counted)
    return count


def as_hydra_runs(app, overrides):
    """What hydra._internal.utils._run_hydra and _run_app do for a run: the mode, then the RUN composition."""
    overrides = list(overrides)
    mode = app.get_mode(config_name="config", overrides=overrides)
    if mode is None:
        overrides.append("hydra.mode=RUN")
    return mode, app.compose_config(config_name="config", overrides=overrides, run_mode=RunMode.RUN)


@pytest.mark.parametrize("overrides", [[], ["recipe=wine_mlp", "optimizer.lr=0.5", "hydra.run.dir=/tmp/x"],
                                       ["hydra.mode=RUN", "trainer.epochs=2"]])
def test_a_run_composes_once_the_config_hydra_composes_twice(hydra_app, compositions, overrides):
    mode, expected = as_hydra_runs(hydra_app, overrides)
    assert compositions[0] == 2
    with once():
        got_mode, got = as_hydra_runs(hydra_app, overrides)
    assert compositions[0] == 3
    assert got_mode == mode
    assert OmegaConf.to_yaml(got) == OmegaConf.to_yaml(expected)  # the hydra node too: what .hydra/ saves


def test_the_held_config_serves_only_the_same_overrides(hydra_app, compositions):
    with once():
        hydra_app.get_mode(config_name="config", overrides=["optimizer.lr=0.5"])
        cfg = hydra_app.compose_config(config_name="config", overrides=["optimizer.lr=0.25"], run_mode=RunMode.RUN)
    assert cfg.optimizer.lr == 0.25 and compositions[0] == 2


@pytest.mark.parametrize("mode", [[], ["hydra.mode=MULTIRUN"]])
def test_sweep_overrides_compose_as_hydra_does(hydra_app, mode):
    overrides = [*mode, "trainer.seed=0,1"]  # RUN mode refuses the sweep: Hydra's own get_mode answers
    expected = hydra_app.get_mode(config_name="config", overrides=overrides)
    assert expected == (RunMode.MULTIRUN if mode else None)
    with once():
        assert hydra_app.get_mode(config_name="config", overrides=overrides) == expected
        with pytest.raises(ConfigCompositionException, match="requires --multirun|Ambiguous"):
            hydra_app.compose_config(config_name="config", overrides=overrides, run_mode=RunMode.RUN)
    assert ConfigLoaderImpl.load_configuration.__name__ == "load_configuration"  # put back
    assert ConfigLoaderImpl.load_configuration.__qualname__.startswith("ConfigLoaderImpl")


def test_the_command_composes_once(compositions, tmp_path, monkeypatch):
    import sys

    import trainkit.__main__ as command
    import trainkit.app as app

    monkeypatch.setenv("TRAINKIT_COMPILE_CACHE", "0")
    monkeypatch.setattr(sys, "argv", ["trainkit", f"hydra.run.dir={tmp_path / 'run'}"])
    monkeypatch.setattr(app, "train", lambda cfg: (_ for _ in ()).throw(SystemExit(7)), raising=False)
    with pytest.raises(SystemExit):
        command._main()
    assert compositions[0] == 1
