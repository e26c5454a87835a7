"""Argument checks shared by the classes configs build: configs come from Hydra, where a bad value would
otherwise fail deep inside MindSpore, after compilation started."""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from trainkit.errors import ConfigError, ConfigTypeError


def check_int(name: str, value: Any, minimum: int) -> int:
    """`value` as an int when it is an integer (not a bool) >= `minimum`; else raise naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigTypeError(f"{name} must be an int >= {minimum}; got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """`value` when it is a bool: a string such as 'false' would otherwise count as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigTypeError(f"{name} must be true or false; got {value!r}")
    return bool(value)
