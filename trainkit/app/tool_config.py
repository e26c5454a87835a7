"""The config the tools (convert, compare, evaluate) build their network and data from, as a run would.

Either Hydra overrides exactly as ``python -m trainkit`` takes them (``model=resnet50 model.num_classes=10``,
``recipe=resnet50_cifar10``), or ``run=RUN_DIR``: the config that run saved (``RUN_DIR/.hydra/config.yaml``),
with ``key=value`` overrides on top (``run=outputs/x model.conv_impl=native``). A config read from a file is data,
and nothing in it is ever evaluated (:mod:`trainkit.rundir.stored_config`), and it names only trusted ``_target_``s
(:mod:`trainkit.rundir.trust`): trainkit's own and those the user trusts (``--trust MODULE``).
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Optional, Sequence

import mindspore as ms
import yaml
from hydra.errors import HydraException
from mindspore import nn
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainkit.app import build
from trainkit.app.config import compose_config
from trainkit.app.finetune import model_arguments
from trainkit.errors import ConfigError
from trainkit.rundir.stored_config import check_plain_data, read_stored_config, with_recorded_hydra_values
from trainkit.rundir.trust import check_trusted, override_targets

RUN_KEY = "run="
_HYDRA_INTERPOLATION = re.compile(r"\$\{hydra:([\w.]+)\}")


def tool_config(overrides: Sequence[str], trust: Sequence[str] = ()) -> DictConfig:
    """The config `overrides` describe: composed by Hydra, or a run's saved config when one is ``run=RUN_DIR``
    (whose targets must be trainkit's own or under the modules `trust` names).

    Raises:
        ConfigError: an override Hydra rejects (an unknown group option such as ``model=resnet9``, a typo in a
            key), ``run=`` naming a folder without a saved config, a group choice next to ``run=``, or a saved
            config naming a target that is not trusted.
    """
    runs = [item for item in overrides if item.startswith(RUN_KEY)]
    rest = [item for item in overrides if not item.startswith(RUN_KEY)]
    if runs:
        return saved_config(Path(runs[-1][len(RUN_KEY):]).expanduser(), rest, trust)
    try:
        return compose_config(rest)
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(" ".join(str(error).split())) from error


def saved_config(run_dir: Path, overrides: Sequence[str], trust: Sequence[str] = (),
                 source: Optional[str] = None) -> DictConfig:
    """``RUN_DIR/.hydra/config.yaml`` read as data (:func:`~trainkit.rundir.stored_config.read_stored_config`:
    nothing in it is evaluated), with ``key=value`` `overrides` applied (keys must exist there), checked to name
    only trusted targets: trainkit's own, those under the modules in `trust`, and those the overrides set.

    The overrides are the user's: applied after the file's check, they may hold interpolations, which are resolved
    here. A key the user overrides is not checked in the file (its value there is dropped unread), so a legacy run
    directory's ``${hydra:runtime.cwd}`` that no ``.hydra/hydra.yaml`` records can be given on the command line.

    Args:
        source: how an error names the file (default: its path).
    """
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"run={run_dir}: {saved} does not exist; run= takes a run directory written by "
                          "python -m trainkit (it holds .hydra/config.yaml)")
    pairs = []
    for item in overrides:
        key, equals, value = item.partition("=")
        if not equals or "." not in key or key.startswith(("+", "~")):
            raise ConfigError(f"{item}: next to run= only key=value overrides of the saved config are accepted "
                              "(e.g. model.conv_impl=native); for group choices such as model=resnet18 give the "
                              "overrides without run=")
        pairs.append((key, value))

    def prepare(container: dict) -> dict:
        container = with_recorded_hydra_values(container, run_dir)
        for key, _ in pairs:  # the file's value of an overridden key is dropped before the check, never read
            parent, _, leaf = key.rpartition(".")
            node = container
            for part in parent.split("."):
                if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                    node = node[int(part)]  # callbacks.0.patience, as OmegaConf.select reads it
                else:
                    node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or leaf not in node:
                raise ConfigError(f"{key} is not a key of {saved}")
            node[leaf] = None
        return container

    cfg = read_stored_config(saved, source or str(saved), prepare)
    for key, value in pairs:
        OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    check_trusted(cfg, source or str(saved), [*trust, *override_targets(overrides)])
    if OmegaConf.select(cfg, "data.download", default=False, throw_on_resolution_failure=False) is True and not any(
            key == "data.download" for key, _ in pairs):
        cfg.data.download = False  # a file's word never makes a tool download; data.download=true given here does
    resolve_saved(cfg, source or str(saved))
    return cfg


def with_hydra_values(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """Deprecated in 0.1.0, removed in 0.3.0: the stored config is read with
    :func:`trainkit.rundir.stored_config.with_recorded_hydra_values` applied before its check (:func:`saved_config`)."""
    warnings.warn("trainkit.app.tool_config.with_hydra_values is deprecated (removed in 0.3.0): read a run "
                  "directory's config with saved_config (or "
                  "trainkit.rundir.stored_config.with_recorded_hydra_values on its plain mapping)",
                  DeprecationWarning, stacklevel=2)
    return OmegaConf.create(with_recorded_hydra_values(OmegaConf.to_container(cfg, resolve=False), run_dir))


def resolve_saved(cfg: DictConfig, source: str) -> None:
    """Resolve, in place, the interpolations the user's overrides brought to a stored config (the file's own held
    none: :func:`saved_config`), and refuse a resolved value that spells a new one (``${a}${b}``).

    Raises:
        ConfigError: an interpolation that cannot be resolved here, or resolves to one, naming its key.
    """
    if next(_interpolations(OmegaConf.to_container(cfg, resolve=False), ""), None) is None:
        return
    try:
        stale = _hydra_interpolation(cfg)  # never resolved from this process's Hydra state (another run's, if any)
        if stale is not None:
            raise ValueError(stale)
        OmegaConf.resolve(cfg)
    except (OmegaConfBaseException, ValueError) as error:
        key, text = stale if stale is not None else _unresolvable(cfg)
        raise ConfigError(f"{source}: {key}={text} cannot be resolved outside the app that ran it "
                          f"({type(error).__name__}); give the value itself, e.g. {key}=/absolute/path") from error
    check_plain_data(OmegaConf.to_container(cfg, resolve=False), f"{source} with the overrides resolved")


def _hydra_interpolation(cfg: DictConfig):
    """The first (key, text) still naming ``${hydra:...}``, which only a running Hydra app could resolve."""
    return next(((path, text) for path, text in _interpolations(OmegaConf.to_container(cfg, resolve=False), "")
                 if _HYDRA_INTERPOLATION.search(text)), None)


def _interpolations(node, path):
    """(dotted key, text) of every string holding an interpolation."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _interpolations(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _interpolations(value, f"{path}[{index}]")
    elif isinstance(node, str) and "${" in node:
        yield path, node


def _unresolvable(cfg: DictConfig):
    """The first key (dotted) whose interpolation fails, and its text."""
    for path, text in _interpolations(OmegaConf.to_container(cfg, resolve=False), ""):
        try:
            OmegaConf.select(cfg, path)
        except OmegaConfBaseException:
            return path, text
    return "KEY", "?"


def set_device(cfg: DictConfig) -> None:
    """``trainer.device_target`` as the app sets it (auto: what the installed MindSpore runs on)."""
    target = str(cfg.trainer.get("device_target", "auto"))
    if target != "auto":
        try:
            ms.set_context(device_target=target)
        except (RuntimeError, ValueError) as error:
            raise ConfigError(f"trainer.device_target={target} is not available to this MindSpore build: use auto "
                              f"or {ms.get_context('device_target')} ({error})") from error


def build_data(cfg: DictConfig):
    """The data module `cfg.data` describes (not prepared: no files are read)."""
    return build.instantiate_group("data", cfg.data)


def build_network(cfg: DictConfig, data=None) -> nn.Cell:
    """The model a run of `cfg` trains, initialised as the run would be (``trainer.seed``), without its weights.

    ``num_classes``/``in_channels`` left null are taken from the data module, as the app does; the fine-tuning
    keys (``model.pretrained``...) are not applied.
    """
    ms.set_seed(int(cfg.trainer.seed))
    return build.build_model(cfg, build_data(cfg) if data is None else data)


def describe_network(cfg: DictConfig, data=None) -> str:
    """``resnet50 (num_classes=10, in_channels=1 from the data; data DigitsData)``: what :func:`build_network`
    builds."""
    data = build_data(cfg) if data is None else data
    filled = build.model_args_from_data(cfg.model, data)
    node = model_arguments(cfg.model)
    shown = [f"{key}={filled.get(key, node.get(key))}" + (" from the data" if key in filled else "")
             for key in ("num_classes", "in_channels") if key in node]
    target = str(node.get("_target_", "model")).rsplit(".", 1)[-1]
    return f"{target} ({', '.join(shown)}; data {type(data).__name__})" if shown else target
