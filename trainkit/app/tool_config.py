"""The config the tools (convert, compare, evaluate) build their network and data from, as a run would.

Either Hydra overrides exactly as ``python -m trainkit`` takes them (``model=resnet50 model.num_classes=10``,
``recipe=resnet50_cifar10``), or ``run=RUN_DIR``: the config that run saved (``RUN_DIR/.hydra/config.yaml``),
with ``key=value`` overrides on top (``run=outputs/x model.conv_impl=native``). A config read from a file names only
trusted ``_target_``s (:mod:`trainkit.rundir.trust`): trainkit's own and those the user trusts (``--trust MODULE``).
"""
from __future__ import annotations

import re
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
from trainkit.rundir.trust import check_trusted, override_targets

RUN_KEY = "run="
_ABSENT = object()


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
    """``RUN_DIR/.hydra/config.yaml`` with ``key=value`` `overrides` applied (keys must exist there), checked to
    name only trusted targets: trainkit's own, those under the modules in `trust`, and those the overrides set.

    Args:
        source: how an error names the file (default: its path).
    """
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"run={run_dir}: {saved} does not exist; run= takes a run directory written by "
                          "python -m trainkit (it holds .hydra/config.yaml)")
    cfg = with_hydra_values(OmegaConf.load(saved), run_dir)
    for item in overrides:
        key, equals, value = item.partition("=")
        if not equals or "." not in key or key.startswith(("+", "~")):
            raise ConfigError(f"{item}: next to run= only key=value overrides of the saved config are accepted "
                              "(e.g. model.conv_impl=native); for group choices such as model=resnet18 give the "
                              "overrides without run=")
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=_ABSENT)  # the leaf unread: it may not resolve here
        if not isinstance(node, DictConfig) or leaf not in node:
            raise ConfigError(f"{key} is not a key of {saved}")
        OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    check_trusted(cfg, source or str(saved), [*trust, *override_targets(overrides)])
    if OmegaConf.select(cfg, "data.download", default=False, throw_on_resolution_failure=False) is True and not any(
            item.partition("=")[0] == "data.download" for item in overrides):
        cfg.data.download = False  # a file's word never makes a tool download (data.download=true on the command line does)
    resolve_saved(cfg, source or str(saved))
    return cfg


_HYDRA_INTERPOLATION = re.compile(r"\$\{hydra:([\w.]+)\}")


def with_hydra_values(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """`cfg` with its ``${hydra:...}`` interpolations replaced by the values the run had, read from the
    ``RUN_DIR/.hydra/hydra.yaml`` Hydra wrote (a run directory saved before trainkit saved its config resolved);
    ``run_dir`` is the run directory itself. Interpolations with no recorded value are left as they are."""
    recorded = run_dir / ".hydra" / "hydra.yaml"
    try:
        hydra_node = OmegaConf.load(recorded).get("hydra") if recorded.is_file() else None
    except (OSError, yaml.YAMLError, OmegaConfBaseException):
        hydra_node = None

    def value(match: "re.Match[str]") -> str:
        found = (OmegaConf.select(hydra_node, match.group(1), default=None, throw_on_resolution_failure=False)
                 if hydra_node is not None else None)
        return str(found) if isinstance(found, (str, int, float)) else match.group(0)

    def fill(node):
        if isinstance(node, dict):
            return {key: fill(item) for key, item in node.items()}
        if isinstance(node, list):
            return [fill(item) for item in node]
        return _HYDRA_INTERPOLATION.sub(value, node) if isinstance(node, str) else node

    container = fill(OmegaConf.to_container(cfg, resolve=False))
    if isinstance(container.get("run_dir"), str) and "${" in container["run_dir"]:
        container["run_dir"] = str(run_dir)
    return OmegaConf.create(container)


def resolve_saved(cfg: DictConfig, source: str) -> None:
    """Resolve `cfg`'s interpolations in place, as the app did before it saved them (a run directory written before
    trainkit saved its config resolved may hold ``${hydra:runtime.cwd}``, which only a running Hydra app knows).

    Raises:
        ConfigError: an interpolation that cannot be resolved here, naming its key and the override that fixes it.
    """
    try:
        stale = _hydra_interpolation(cfg)  # never resolved from this process's Hydra state (another run's, if any)
        if stale is not None:
            raise ValueError(stale)
        OmegaConf.resolve(cfg)
    except (OmegaConfBaseException, ValueError) as error:
        key, text = stale if stale is not None else _unresolvable(cfg)
        raise ConfigError(f"{source}: {key}={text} cannot be resolved outside the app that saved it "
                          f"({type(error).__name__}: the run was saved by an older trainkit); give the value after "
                          f"the run, e.g. {key}=/absolute/path") from error


def _hydra_interpolation(cfg: DictConfig):
    """The first (key, text) still naming ``${hydra:...}``, which only the Hydra run that saved it could resolve."""
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
