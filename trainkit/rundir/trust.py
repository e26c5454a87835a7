"""A config read from a file is data, never code: the ``_target_``s it may name.

``hydra.utils.instantiate`` calls whatever ``_target_`` names, with the arguments next to it. On the command line
that is the user's choice; in a file -- a checkpoint's stored config, a run directory's ``.hydra/config.yaml`` -- it
is the choice of whoever wrote the file. Hydra's own block list stops ``os.system``, not ``pathlib.Path.write_text``
or ``shutil.copyfile``, which are enough to plant code (a ``.pth`` file in site-packages runs at the next start).

So, as ``torch.load(weights_only=True)`` does for pickles, a config read from a file may name only

* trainkit's own targets: those the configs and recipes trainkit ships name (:func:`shipped_targets`: its models,
  data modules, losses, schedules, wrapper, and the MindSpore optimizers, losses and metrics they choose), and
* what the user trusts explicitly, from the command line and never from the file: a module (``--trust mypkg``
  trusts the classes and functions ``mypkg`` and its submodules *define*, not what they import: a name such as
  ``mypkg.data.Path.write_text`` is ``pathlib``'s and stays untrusted) or one target (``--trust mypkg.models.Net``).

A config read from a file is data in its values too, and nothing in it is ever evaluated: it is read by
:func:`trainkit.rundir.stored_config.read_stored_config`, which refuses any ``${`` in it (a plain reference, a
resolver call, an escaped interpolation alike), so the targets checked here are the file's own text: no
interpolation of the file's makes or hides one.

Every ``_target_`` is checked, at any depth (``_args_``, lists, ``_partial_`` nodes alike), before anything of the
config is imported or called. A target given on the command line as an override (``model._target_=...``) is the
user's, so it is trusted too.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from importlib import resources
from typing import FrozenSet, Iterable, Iterator, Optional, Sequence, Tuple

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from trainkit.errors import ConfigError
from trainkit.process.moved_modules import former_names

TARGET = "_target_"
_MAX_DEPTH = 32


@functools.lru_cache(maxsize=1)
def shipped_targets() -> FrozenSet[str]:
    """Every ``_target_`` named in the YAML files of ``trainkit.configs`` and ``trainkit.recipes``, and the paths
    those had before their module moved (a run stored before 0.2 names them so)."""
    found = set()
    for package in ("trainkit.configs", "trainkit.recipes"):
        for path in _yaml_files(resources.files(package)):
            try:
                found.update(_targets_in(yaml.safe_load(path.read_text(encoding="utf-8"))))
            except yaml.YAMLError:
                continue
    found.update(old for target in list(found) for old in former_names(target))  # as runs before 0.2 stored them
    return frozenset(found)


def is_trusted(target: str, trusted: Iterable[str] = ()) -> bool:
    """Whether `target` is trainkit's own, a trusted target, or defined under one of the `trusted` modules."""
    if target in shipped_targets() or target in trusted:
        return True
    return any(target.startswith(name + ".") and _defined_under(target, name) for name in trusted)


def _defined_under(target: str, module: str) -> bool:
    """Whether `target` names a class or function that `module` (or a submodule) defines, not one it imports.

    Only modules under the trusted name are imported to find out: the user trusts their code already."""
    from hydra._internal.utils import _locate

    try:
        found = _locate(target)
    except Exception:  # noqa: BLE001 -- a name that does not import is not one trainkit can vouch for
        return False
    home = getattr(found, "__module__", None)
    callable_kind = inspect.isclass(found) or inspect.isfunction(found) or inspect.ismethod(found)
    return callable_kind and isinstance(home, str) and (home == module or home.startswith(module + "."))


def check_trusted(cfg: DictConfig, source: str, trusted: Sequence[str] = (), how: str = "--trust MODULE") -> None:
    """Raise ConfigError naming every ``_target_`` of `cfg` (read from `source`) that is not trusted.

    Args:
        cfg: the config read from the file (with the user's overrides applied).
        source: how the message names the file (``checkpoint PATH``, ``PATH/.hydra/config.yaml``).
        trusted: modules or targets the user trusts explicitly.
        how: how the user trusts one (``--trust MODULE`` on the tools' command line).
    """
    refused = []
    for where, target in targets(cfg):
        if not isinstance(target, str) or not target.strip():
            raise ConfigError(f"{source}: {where}={target!r} is not a target trainkit can check: a config read from "
                              "a file may name only trusted targets (a dotted path)")
        if not is_trusted(target, trusted):
            refused.append((where, target))
    if not refused:
        return
    imported = [(where, target, name) for where, target in refused for name in trusted
                if target.startswith(name + ".")]
    if imported:
        where, target, name = imported[0]
        raise ConfigError(f"{source} names {where}={target}, which is not a class or function {name} defines (a "
                          f"name {name} imports from elsewhere, or one that does not import): trusting {name} "
                          f"trusts what it defines, nothing else")
    modules = list(dict.fromkeys(target.rsplit(".", 1)[0] if "." in target else target for _, target in refused))
    named = " and ".join(f"{where}={target}" for where, target in refused)
    fix = " ".join(how.replace("MODULE", module) for module in modules)
    raise ConfigError(f"{source} names {named}, which {'is' if len(refused) == 1 else 'are'} not trusted: a config "
                      f"read from a file may call only trainkit's own targets and those you trust; if you trust this "
                      f"file, trust it with {fix}")


def check_data_only(container, source: str, path: str = "") -> None:
    """Deprecated in 0.1.0, removed in 0.3.0: :func:`trainkit.rundir.stored_config.check_plain_data` (which refuses
    every ``${``, plain references included)."""
    warnings.warn("trainkit.rundir.trust.check_data_only is deprecated (removed in 0.3.0): a config read from a "
                  "file is read with trainkit.rundir.stored_config.read_stored_config, which refuses every "
                  "interpolation",
                  DeprecationWarning, stacklevel=2)
    from trainkit.rundir.stored_config import check_plain_data

    check_plain_data(container if not path else _nested(container, path), source)


def _nested(container, path: str):
    for part in reversed(path.split(".")):
        container = {part: container}
    return container


def targets(cfg, path: str = "", depth: int = 0) -> Iterator[Tuple[str, object]]:
    """(``key.path._target_``, value) for every ``_target_`` in `cfg`, interpolations resolved (a node made by
    ``${oc.create:...}`` is walked like any other); a node that does not resolve here cannot be instantiated
    either, and is passed over."""
    if depth > _MAX_DEPTH:
        raise ConfigError(f"{path}: the config nests deeper than {_MAX_DEPTH} levels (a node that refers to itself?)")
    if isinstance(cfg, DictConfig):
        for key in cfg:
            name = f"{path}.{key}" if path else str(key)
            if key == TARGET:
                yield name, _value(cfg, key)
            else:
                yield from targets(_resolved(cfg, key), name, depth + 1)
    elif isinstance(cfg, ListConfig):
        for index in range(len(cfg)):
            yield from targets(_resolved(cfg, index), f"{path}[{index}]", depth + 1)


def _resolved(node, key):
    """``node[key]`` resolved, as instantiate would see it; None where it does not resolve."""
    try:
        return node[key]
    except Exception:  # a missing value, an interpolation that does not resolve outside its run
        return None


def override_targets(overrides: Sequence[str]) -> Tuple[str, ...]:
    """The targets the user set on the command line (``KEY._target_=VALUE``): theirs, so trusted."""
    return tuple(item.split("=", 1)[1] for item in overrides
                 if "=" in item and item.split("=", 1)[0].lstrip("+~").endswith(TARGET))


def _value(node: DictConfig, key: str) -> Optional[object]:
    try:
        value = node[key]
    except Exception:  # an interpolation that does not resolve: not a name trainkit can check
        return node._get_node(key)._value()
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _targets_in(value) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == TARGET and isinstance(item, str):
                yield item
            else:
                yield from _targets_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _targets_in(item)


def _yaml_files(folder) -> Iterator:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _yaml_files(entry)
        elif entry.name.endswith(".yaml"):
            yield entry


WEIGHTS_ONLY = ("(this form reads the weights alone and builds nothing from a stored config, so it calls nothing; "
                "accepted so that one command line fits every form) ")


def add_trust_argument(parser, where: str = "") -> None:
    """The tools' ``--trust MODULE`` flag (evaluate, compare, convert): given on the command line, never read from
    a file. `where` says when it applies (``"with run=RUN_DIR: "``)."""
    parser.add_argument("--trust", action="append", default=[], metavar="MODULE",
                        help=f"{where}a module (or one target) whose _target_s a stored config may name, besides "
                             "trainkit's own; repeat for several (e.g. --trust mypkg)")
