"""A file's config is data, and nothing in it is ever evaluated: the one reader of every config read from a file.

trainkit reads a config back from a file in two places: a run directory's ``.hydra/config.yaml`` (``evaluate
RUN_DIR``, ``predict``/``export``/``convert``/``compare`` with ``run=RUN_DIR``) and the config a training
checkpoint stores (``evaluate CKPT``, ``trainer.resume=FILE``). Both are read by :func:`read_stored_config`, which
parses the text as plain YAML (``yaml.SafeLoader``: strings, numbers, booleans, nulls, mappings and lists; no tag of
Python's, no alias for a mapping or a list), then walks every key and every value at any depth and refuses any
string holding ``${`` -- a reference, a resolver call, an escaped ``\\${`` alike. OmegaConf treats a string as an
interpolation exactly when it holds ``${``, so a config built from what is left holds none: nothing of the file is
parsed as an interpolation, resolved or called by OmegaConf (``${a}${b}`` cannot concatenate into a live
``${oc.create:...}``, as no reference is followed). trainkit saves its configs resolved, so a file of its own passes.

What the file names as ``_target_`` is checked separately (:mod:`trainkit.rundir.trust`): which classes a config
read from a file may make ``hydra.utils.instantiate`` call.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator, Optional, Tuple, Union

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainkit.errors import ConfigError

MAX_BYTES = 1 << 20  # a stored config is a few kilobytes (2 KB for the defaults)
MAX_DEPTH = 64
_PLAIN = (str, int, float, bool, type(None))
_SIMPLE_KEY = re.compile(r"[\w\-]+\Z")


def read_stored_config(text_or_path: Union[str, os.PathLike], source: str,
                       prepare: Optional[Callable[[dict], dict]] = None) -> DictConfig:
    """The config `text_or_path` holds, as plain data: a ``str`` is the YAML text, a path the file to read.

    Args:
        source: how a message names where the text comes from (``the config stored in checkpoint PATH``).
        prepare: a change to the parsed mapping made before the check (the values a legacy run directory's
            ``.hydra/hydra.yaml`` recorded, :func:`with_recorded_hydra_values`); its result is checked too.

    Raises:
        ConfigError: one line: the file is not a regular file, is larger than :data:`MAX_BYTES`, is not YAML,
            is not a mapping, or holds ``${`` (naming the key, ``data.x`` or ``callbacks[3]``) or a value no
            config holds.
    """
    container = read_stored_yaml(text_or_path, source)
    if not isinstance(container, dict):
        raise ConfigError(f"{source} holds a YAML {type(container).__name__}, not a config (a mapping of keys)")
    if prepare is not None:
        container = prepare(container)
    check_plain_data(container, source)
    try:
        return OmegaConf.create(container)
    except OmegaConfBaseException as error:  # a key type OmegaConf refuses (e.g. null)
        raise ConfigError(f"{source} is not a config trainkit can read: {' '.join(str(error).split())}") from error


def read_stored_yaml(text_or_path: Union[str, os.PathLike], source: str) -> object:
    """The YAML `text_or_path` holds, parsed as plain data and not checked (``.hydra/hydra.yaml``, whose values
    are looked up, never used whole); the bounds of :func:`read_stored_config` hold."""
    text = text_or_path if isinstance(text_or_path, str) else _read_bounded(Path(text_or_path), source)
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{source} holds {len(text)} characters, more than a config ({MAX_BYTES} at most)")
    try:
        parsed = yaml.load(text, Loader=_PlainLoader)  # noqa: S506 -- a SafeLoader, narrower still
    except yaml.YAMLError as error:
        raise ConfigError(f"{source} is not valid YAML: {' '.join(str(error).split())[:300]}") from error
    except RecursionError as error:
        raise ConfigError(f"{source} nests deeper than YAML can be read here") from error
    _refuse_shared(parsed, source)
    return parsed


def check_plain_data(container: object, source: str) -> None:
    """Raise ConfigError naming the first key whose name or value (at any depth, lists included) holds ``${``, or
    whose value is not one a config holds (a YAML date, binary, set)."""
    for where, problem in _refusals(container):
        raise ConfigError(f"{source}: {where} {problem}")


def _refusals(node: object, path: str = "", depth: int = 0) -> Iterator[Tuple[str, str]]:
    if depth > MAX_DEPTH:
        yield path or "the top", f"nests deeper than {MAX_DEPTH} levels, which no config does"
    elif isinstance(node, dict):
        for key, value in node.items():
            name = f"{path}.{_shown(key)}" if path else _shown(key)
            if not isinstance(key, (str, int, float, bool)):
                yield path or "the top level", f"has the key {key!r} (a YAML {type(key).__name__}), which no config has"
            elif isinstance(key, str) and "${" in key:
                yield name, f"is a key holding an interpolation: {_INTERPOLATION}"
            else:
                yield from _refusals(value, name, depth + 1)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _refusals(value, f"{path}[{index}]", depth + 1)
    elif isinstance(node, str) and "${" in node:
        yield path, f"holds {node[:80]!r}, an interpolation: {_INTERPOLATION}"
    elif not isinstance(node, _PLAIN):
        yield path, f"holds a YAML {type(node).__name__}, which a config does not (strings, numbers, booleans, null)"


_INTERPOLATION = ("a config read from a file is data, and nothing in it is ever evaluated (trainkit saves its configs "
                  "resolved, so a file of its own holds no '${'): the file was edited or written by an older "
                  "trainkit; give the value on the command line instead")


def _shown(key: object) -> str:
    """A key as a message names it: as it is when it is a plain name, else quoted (one line whatever it holds)."""
    return key if isinstance(key, str) and _SIMPLE_KEY.match(key) else repr(key)


def _read_bounded(path: Path, source: str) -> str:
    """The text of `path`, a regular file of at most :data:`MAX_BYTES` (never a FIFO or a device that blocks or
    never ends)."""
    try:
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | getattr(os, "O_NONBLOCK", 0))) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{source} is not a regular file: a config is read from a file only")
            data = f.read(MAX_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{source} cannot be read: {error.strerror or error}") from error
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{source} is larger than a config ({MAX_BYTES} bytes at most)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{source} is not UTF-8 text: {error.reason} at byte {error.start}") from error


class _PlainLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """``yaml.SafeLoader`` (libyaml's where installed) reading YAML as OmegaConf's loader does (``1e-3`` is a
    float, a date stays a string, a key given twice is an error)."""

    def construct_mapping(self, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in keys:
                    raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                            f"found duplicate key {key_node.value}",
                                                            key_node.start_mark)
                keys.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _refuse_shared(parsed: object, source: str) -> None:
    """Raise ConfigError where a mapping or list is reached twice (a YAML alias: a few lines of them expand to
    billions of nodes, a cycle to infinitely many) or nests deeper than :data:`MAX_DEPTH`."""
    seen, stack = set(), [(parsed, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if id(node) in seen:
            raise ConfigError(f"{source} uses a YAML alias (*name) for a mapping or a list, which a config does not "
                              "(trainkit writes none)")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source} nests deeper than {MAX_DEPTH} levels, which no config does")
        seen.add(id(node))
        stack.extend((item, depth + 1) for item in (node.values() if isinstance(node, dict) else node))


_PlainLoader.yaml_implicit_resolvers = {  # a copy: yaml.SafeLoader's own stay as they are
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_PlainLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X), list("-+0123456789."))  # OmegaConf's: 1e-3 is a float


_HYDRA_INTERPOLATION = re.compile(r"\$\{hydra:([\w.]+)\}")


def with_recorded_hydra_values(container: dict, run_dir: Path) -> dict:
    """`container` with its ``${hydra:KEY}`` text replaced by the values ``RUN_DIR/.hydra/hydra.yaml`` recorded
    (a run directory saved before trainkit saved its config resolved), and a ``run_dir`` left as one
    ``${hydra:KEY}`` by `run_dir` itself. A replacement is text (a recorded value is looked up, never resolved),
    and what it leaves, ``${`` from a recorded value included, is checked as the rest of the file is."""
    recorded = Path(run_dir) / ".hydra" / "hydra.yaml"
    try:
        hydra_yaml = read_stored_yaml(recorded, str(recorded)) if recorded.is_file() else None
    except ConfigError:
        hydra_yaml = None  # no record: the interpolations stay and are refused, naming their key
    hydra_node = hydra_yaml.get("hydra") if isinstance(hydra_yaml, dict) else None

    def value(match: "re.Match[str]") -> str:
        found: object = hydra_node
        for part in match.group(1).split("."):
            found = found.get(part) if isinstance(found, dict) else None
        return str(found) if isinstance(found, (str, int, float)) and not isinstance(found, bool) else match.group(0)

    def fill(node):
        if isinstance(node, dict):
            return {key: fill(item) for key, item in node.items()}
        if isinstance(node, list):
            return [fill(item) for item in node]
        return _HYDRA_INTERPOLATION.sub(value, node) if isinstance(node, str) else node

    filled = fill(container)
    if isinstance(filled.get("run_dir"), str) and _HYDRA_INTERPOLATION.fullmatch(filled["run_dir"]):
        filled["run_dir"] = str(run_dir)  # unrecorded: the run directory it was read from
    return filled
