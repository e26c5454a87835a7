"""Whether a set of named values fits a network's Parameters, said in one sentence a user can act on.

A resume (``checkpoint``), fine-tuning and ``trainkit.bridge.convert`` (``weights``) all load values by name and must
refuse, before anything is loaded, values that are missing, unknown or of another shape.
"""
from __future__ import annotations

from typing import Callable, List, Mapping, Sequence


def listing(names: Sequence[str], shown: int = 6) -> str:
    """``a, b, c and 4 more``."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def fit_problems(own: Mapping[str, object], values: Mapping[str, object], source: str, network: str, *,
                 excused: Callable[[str], bool] = lambda name: False, dtypes: bool = False) -> List[str]:
    """Why `values` (name -> array or Tensor) do not fit `own` (name -> Parameter); empty when they do.

    Args:
        own: the network's Parameters by name.
        values: what would be loaded into them, e.g. a checkpoint's entries.
        source: how to name `values` in the message ("the checkpoint", a file).
        network: how to name `own` ("the network", "this run's network").
        excused: names that may be missing, unknown or shaped differently.
        dtypes: also refuse a value of the right shape and another dtype.
    """
    missing = [name for name in own if name not in values and not excused(name)]
    unknown = [name for name in values if name not in own and not excused(name)]
    both = [(name, values[name], parameter) for name, parameter in own.items() if name in values and not excused(name)]
    different = [f"{name} {tuple(value.shape)} in {source}, {tuple(parameter.shape)} in {network}"
                 for name, value, parameter in both if tuple(value.shape) != tuple(parameter.shape)]
    if dtypes:
        different += [f"{name} {value.dtype} in {source}, {parameter.dtype} in {network}"
                      for name, value, parameter in both
                      if tuple(value.shape) == tuple(parameter.shape) and value.dtype != parameter.dtype]
    problems = []
    if missing:
        problems.append(f"missing from {source}: {listing(missing)}")
    if unknown:
        problems.append(f"not in {network}: {listing(unknown)}")
    if different:
        problems.append(f"shaped {'or typed ' if dtypes else ''}differently: {listing(different)}")
    return problems
