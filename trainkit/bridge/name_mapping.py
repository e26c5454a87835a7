"""From PyTorch parameter names to the network's: a user's ordered regex rules, then the built-in batch-norm rule.

Convolutions and linear layers keep their names and layouts (``nn.Conv2d`` weights are (out, in/groups, kh, kw)
and ``nn.Dense`` weights (out, in) on both sides), and trainkit's ResNets use torchvision's names, so for them
only batch norm differs: torch's ``weight/bias/running_mean/running_var`` are MindSpore's
``gamma/beta/moving_mean/moving_variance``, and torch's ``num_batches_tracked`` counter has no counterpart
(it is dropped). The batch-norm rule renames only where the network has the MindSpore name, so a Linear's
``weight`` is never taken for a gamma.

Other models name their layers differently: a mapping file holds rules applied in order to every source name
(``re.sub``'s meaning, matched by RE2, whose time is linear in the name: no backreferences or lookaround, and a
pattern such as ``^(a+)+$`` cannot hang a conversion; a rule whose replacement is null drops the names it
matches)::

    # mapping.yaml
    - {pattern: '^encoder\\.', replace: 'body.'}
    - {pattern: '^classifier\\.', replace: 'body.2.'}
    - {pattern: '^aux_head\\.', replace: null}
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import re2
import yaml

from trainkit.data.input_file import read_input
from trainkit.errors import ConfigError

BATCH_NORM_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
                    "running_var": "moving_variance"}
BATCH_NORM_COUNTER = "num_batches_tracked"
_RE2 = re2.Options()
_RE2.log_errors = False  # the error is raised (and said in one line), not also logged by RE2 to stderr


@dataclass(frozen=True)
class Rule:
    """``pattern.sub(replace, name)``; `replace` None drops the names `pattern` matches (an RE2 pattern)."""

    pattern: Any
    replace: Optional[str]


@dataclass
class NameMapping:
    """Where each source name went: ``targets`` (source -> network name) and ``dropped`` (source -> why)."""

    targets: Dict[str, str]
    dropped: Dict[str, str]
    renamed_batch_norm: int


def load_rules(path: Union[str, Path]) -> List[Rule]:
    """The rules of a mapping file: a YAML list of ``{pattern: REGEX, replace: TEXT or null}`` (or ``rules:`` one).

    Raises:
        ConfigError: the file is missing, not a regular file, not YAML, or a rule is malformed (its index and what
            is valid).
    """
    path = Path(path)
    text = read_input(path, error=ConfigError, name=f"mapping file {path}").decode("utf-8")  # a FIFO would hang
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"mapping file {path} is not valid YAML: {' '.join(str(error).split())}") from error
    if isinstance(loaded, dict) and set(loaded) == {"rules"}:
        loaded = loaded["rules"]
    if not isinstance(loaded, list):
        raise ConfigError(f"mapping file {path} must hold a list of rules {{pattern: REGEX, replace: TEXT or null}}")
    rules = []
    for index, item in enumerate(loaded):
        if not isinstance(item, dict) or set(item) != {"pattern", "replace"} or not isinstance(item["pattern"], str) \
                or not isinstance(item["replace"], (str, type(None))):
            raise ConfigError(f"mapping file {path}, rule {index}: {item!r} is not valid: each rule is "
                              "{pattern: REGEX, replace: TEXT or null}")
        try:
            rules.append(Rule(re2.compile(item["pattern"], _RE2), item["replace"]))
        except re2.error as error:
            reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) \
                else str(error)
            raise ConfigError(f"mapping file {path}, rule {index}: pattern {item['pattern']!r} is not a valid "
                              f"regular expression: {reason} (rules use RE2's syntax, which matches in linear time: "
                              "no backreferences or lookaround)") from error
    return rules


def apply_rules(name: str, rules: Iterable[Rule]) -> Optional[str]:
    """`name` after every rule in order; None when a dropping rule matches it."""
    for rule in rules:
        if rule.replace is None:
            if rule.pattern.search(name):
                return None
        else:
            name = rule.pattern.sub(rule.replace, name)
    return name


def map_names(source_names: Iterable[str], target_names: Iterable[str], rules: Iterable[Rule] = ()) -> NameMapping:
    """Map each source name to a network name: the user's rules, then batch norm's names where the network has them.

    Raises:
        ConfigError: two source names map to the same network name (a rule too broad).
    """
    rules = list(rules)
    targets = set(target_names)
    mapped: Dict[str, str] = {}
    dropped: Dict[str, str] = {}
    renamed = 0
    for source in source_names:
        name = apply_rules(source, rules)
        if name is None:
            dropped[source] = "dropped by a mapping rule"
            continue
        if name.rsplit(".", 1)[-1] == BATCH_NORM_COUNTER and name not in targets:
            dropped[source] = "batch norm's step counter: MindSpore's BatchNorm has none"
            continue
        batch_norm = _batch_norm_name(name, targets)
        if batch_norm is not None:
            name, renamed = batch_norm, renamed + 1
        mapped[source] = name
    _check_unique(mapped)
    return NameMapping(mapped, dropped, renamed)


def module_name(name: str, parameter_names: Dict[str, str], rules: Iterable[Rule] = ()) -> Optional[str]:
    """The network's name for a torch module: through one of its parameters' mapping, else through the rules.

    `parameter_names` maps a torch module's parameter names (``layer1.0.bn1.weight``) to the network's.
    """
    for source, target in parameter_names.items():
        module, _, _ = source.rpartition(".")
        if module == name:
            return target.rpartition(".")[0]
    return apply_rules(name, rules)


def _batch_norm_name(name: str, targets: set) -> Optional[str]:
    if name in targets or "." not in name:
        return None
    module, leaf = name.rsplit(".", 1)
    renamed = f"{module}.{BATCH_NORM_NAMES[leaf]}" if leaf in BATCH_NORM_NAMES else None
    return renamed if renamed in targets else None


def _check_unique(mapped: Dict[str, str]) -> None:
    seen: Dict[str, str] = {}
    clashes: List[Tuple[str, str, str]] = []
    for source, target in mapped.items():
        if target in seen:
            clashes.append((seen[target], source, target))
        seen.setdefault(target, source)
    if clashes:
        first, second, target = clashes[0]
        raise ConfigError(f"the mapping sends both {first} and {second} to {target} ({len(clashes)} such clashes): "
                          "make the rule that renames them more specific")
