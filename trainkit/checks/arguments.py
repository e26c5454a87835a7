"""Argument checks shared by the classes configs build: configs come from Hydra, where a bad value would
otherwise fail deep inside MindSpore, after compilation started."""
from __future__ import annotations

import difflib
import keyword
import numbers
import os
import sys
from enum import Enum
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Tuple

import numpy as np

from trainkit.errors import ConfigError, ConfigTypeError


def check_number(name: str, value: Any, valid: str, in_range: Callable[[Any], bool],
                 types: Tuple[type, ...] = (numbers.Real,)) -> Any:
    """`value` when it is a number of `types` (never a bool) for which `in_range` holds; else raise
    ConfigTypeError / ConfigError saying ``<name> must be <valid>; got <value>``."""
    if isinstance(value, bool) or not isinstance(value, types):
        raise ConfigTypeError(f"{name} must be {valid}; got {value!r} ({type(value).__name__})")
    if not in_range(value):
        raise ConfigError(f"{name} must be {valid}; got {value!r}")
    return value


def check_int(name: str, value: Any, minimum: int) -> int:
    """`value` as an int when it is an integer (not a bool) >= `minimum`; else raise naming `name`."""
    return int(check_number(name, value, f"an int >= {minimum}", lambda v: v >= minimum, (numbers.Integral,)))


def check_bool(name: str, value: Any) -> bool:
    """`value` when it is a bool: a string such as 'false' would otherwise count as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigTypeError(f"{name} must be true or false; got {value!r}")
    return bool(value)


def check_split_fractions(test_fraction: Any, val_fraction: Any) -> Tuple[float, float]:
    """(test_fraction, val_fraction) of a data module that carves both from one set: each in (0, 1), their sum
    below 1 so that something is left to train on."""
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real)
            or not 0.0 < float(test_fraction) < 1.0):
        raise ConfigError(f"test_fraction must be a number in (0, 1); got {test_fraction!r}")
    if (isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real)
            or not 0.0 < float(val_fraction) < 1.0 or float(val_fraction) + float(test_fraction) >= 1.0):
        raise ConfigError(f"val_fraction must be a number in (0, 1) with test_fraction + val_fraction < 1; got "
                          f"{val_fraction!r} (test_fraction {float(test_fraction)})")
    return float(test_fraction), float(val_fraction)


def did_you_mean(name: str, valid: Iterable[str], prefix: str = "") -> str:
    """``"did you mean trainer.epochs? "`` for the closest of `valid` to `name`, or ``""``.

    Closeness is difflib's ratio with ``get_close_matches``' cutoff (0.6); names tied for the closest are all
    offered (``mea`` is as close to ``mae`` as to ``mse``: picking one would guess).
    """
    scores = {candidate: difflib.SequenceMatcher(None, candidate, name).ratio() for candidate in valid}
    best = max(scores.values(), default=0.0)
    if best < 0.6:
        return ""
    return f"did you mean {' or '.join(prefix + c for c, score in scores.items() if score == best)}? "


def choice(value: Any) -> str:
    """A config choice as its string: structured configs hold enum members (``ExecutionMode.graph``)."""
    return value.value if isinstance(value, Enum) else str(value)


def package_name_problem(name: str, where: Optional[Path] = None) -> Optional[str]:
    """Why `name` cannot name a package trainkit writes (None when it can), as the end of a sentence.

    Not an ASCII identifier: Hydra's override lexer (``model=NAME``, ``_target_: NAME.model...``) takes ASCII
    only. The name of a module Python already finds (the standard library's, an installed package's):
    ``python -m NAME`` and ``import NAME`` would run that one, not the written package. `where` (the folder the
    package goes into), the current folder and namespace folders (regular packages win over them) do not count.
    """
    if not (name.isascii() and name.isidentifier()):
        return "is not an ASCII Python identifier (letters a-z and A-Z, digits and _, not starting with a digit)"
    if keyword.iskeyword(name):
        return "is a Python keyword"
    if name.startswith("__") and name.endswith("__") or name in ("sitecustomize", "usercustomize"):
        return ("is a name Python gives a meaning of its own (__main__, __init__ and the other dunder names, "
                "sitecustomize, usercustomize)")
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return f"is a module of Python's standard library: python -m {name} would run that one"
    skip = {Path.cwd().resolve(), *([Path(where).resolve()] if where is not None else [])}
    search = [entry for entry in sys.path if entry and Path(os.path.abspath(entry)).resolve() not in skip]
    try:
        spec = PathFinder.find_spec(name, search)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin not in (None, "namespace"):  # a namespace folder loses to a package
        return f"is an installed module ({spec.origin}): python -m {name} would run that one"
    return None
