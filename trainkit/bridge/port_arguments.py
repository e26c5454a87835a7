"""The top-level Cell's constructor arguments: PyTorch's own, where the model was built from them.

A model built as ``ViT(num_classes=10)`` is ported as ``class ViT(nn.Cell): def __init__(self, num_classes=10)``
with ``num_classes`` written where the value came from it, not as the number ``10``. Which literal comes from
which argument is not guessed from equal numbers: the model is built again with the argument changed (``10`` ->
``11``, else ``20``) and ported again; the literals that changed with it (``11``, or ``2 * 11`` for ``20``) take the
argument's name. An argument is kept only when everything it changes can be written so: the layers of the top
class (not its ``construct``, nor a class below it, whose constants would then disagree with it).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Tuple


def constructor_values(factory: Callable, given: Dict[str, Any]) -> Dict[str, Any]:
    """The numeric arguments `factory` was called with: `given`, else its defaults (``seed``-like flags too)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}
    values = {}
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or name == "self":
            continue
        value = given.get(name, parameter.default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values[name] = value
    return values


def changed(value: Any) -> Tuple[Any, ...]:
    """Other values of an argument to see what follows it, in turn until the model takes one (a width that
    must divide by the number of heads refuses ``+ 1``, takes ``* 2``)."""
    return (value + 1, value * 2) if isinstance(value, int) else (value + 0.125,)


def expression(before: Any, after: Any, name: str, value: Any, other: Any) -> Optional[str]:
    """The code of a literal that was `before` with the argument `name` = `value` and `after` with `other`:
    ``name``, ``k * name``, a tuple of those and constants; None when it does not follow the argument so."""
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        parts = [repr(b) if b == a else expression(b, a, name, value, other) for b, a in zip(before, after)]
        if any(part is None for part in parts):
            return None
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if isinstance(before, bool) or isinstance(after, bool):
        return None
    if before == value and after == other:
        return name
    if isinstance(before, int) and isinstance(after, int) and isinstance(value, int) and value \
            and before % value == 0 and after == before // value * other:
        return f"{before // value} * {name}"
    return None


def follow(slots: Dict[Tuple, Any], again: Dict[Tuple, Any], name: str, value: Any,
           other: Any) -> Optional[Dict[Tuple, str]]:
    """slot path -> code for the literals that follow the argument; None when one changed otherwise."""
    if set(slots) != set(again):
        return None
    found = {}
    for path, before in slots.items():
        after = again[path]
        if repr(before) == repr(after):
            continue
        code = expression(before, after, name, value, other)
        if code is None:
            return None
        found[path] = code
    return found
