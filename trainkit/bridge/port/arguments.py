"""The top-level Cell's constructor arguments: PyTorch's own, where the model was built from them.

A model built as ``ViT(num_classes=10)`` is ported as ``class ViT(nn.Cell): def __init__(self, num_classes=10)``
with ``num_classes`` written where the value came from it, not as the number ``10``. Which literal comes from
which argument is not guessed from equal numbers: the model is built again with the argument changed (``10`` ->
``11``, else ``20``) and ported again; the literals that changed with it (``11``, or ``2 * 11`` for ``20``) take the
argument's name. An argument is kept only when everything it changes can be written so: the layers of the top
class (not its ``construct``, nor a class below it, whose constants would then disagree with it), or the number of
blocks in a list of them (a depth, :mod:`trainkit.bridge.port.depth`), or of a class below that the top class
hands it to (:mod:`trainkit.bridge.port.nested`). A list argument (``layers=[2, 2, 2, 2]``) is
changed one item at a time, each item followed as ``layers[0]``; it is kept when every item is.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from trainkit.bridge.port import code as port_code
from trainkit.bridge.port import depth as port_depth
from trainkit.bridge.port import nested as port_nested
from trainkit.bridge.port.names import RESERVED


def constructor_values(factory: Callable, given: Dict[str, Any]) -> Dict[str, Any]:
    """The numeric arguments `factory` was called with, and the lists of integers: `given`, else its defaults
    (``seed``-like flags too)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}
    values = {}
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or name == "self":
            continue
        if not port_code.safe_identifier(name) or name in RESERVED:
            continue  # (a name that is no Python name, or one the generated module uses itself: a literal)
        value = given.get(name, parameter.default)
        if _number(value) or isinstance(value, (list, tuple)) and value and all(
                isinstance(item, int) and not isinstance(item, bool) for item in value):  # depths, widths
            values[name] = value
    return values


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def take(top: Any, below: List[str], values: Dict[str, Any],
         again: Callable[[Dict[str, Any]], Optional[Tuple[Any, ...]]], variants: Sequence[Any] = ()) -> None:
    """Give `top` (the top class's :class:`~trainkit.bridge.port.source.Variant`) the arguments of `values` that
    only its own layers follow, or depths it hands down. `below` is the source of the other classes, `variants`
    those classes; `again` ports the model built with some arguments changed: its top Variant, the other classes'
    source (and those classes), None when it does not port (it raises when the model refuses the values)."""
    slots = dict(port_code.slots(top.instances[0], ()))
    for name, value in values.items():
        handed: List[port_nested.HandedDown] = []  # a depth's changes to the classes below, made if it is kept
        if isinstance(value, (list, tuple)):
            found: Optional[Dict[Tuple, Any]] = {}
            for index in range(len(value)):
                part = _followed(top, slots, below, name, value, index, again)
                if part is None:
                    found = None
                    break
                found.update(part)
        else:
            found = _followed(top, slots, below, name, value, None, again, variants, handed)
        if found and not set(found) & set(top.driven):
            top.driven.update(found)
            top.arguments[name] = value
            for change in handed:
                change.apply()
    port_depth.settle(top.driven)
    top.construct = port_depth.roll(top.construct, port_depth.loops(top.driven))


def _followed(top: Any, slots: Dict[Tuple, Any], below: List[str], name: str, value: Any, index: Optional[int],
              again: Callable[[Dict[str, Any]], Optional[Tuple[Any, ...]]], variants: Sequence[Any] = (),
              handed: Optional[List[port_nested.HandedDown]] = None) -> Optional[Dict[Tuple, Any]]:
    """slot path -> code (or :class:`~trainkit.bridge.port.depth.Run`) of what follows the argument `name` (its
    item `index` for a list, written ``name[index]``); {} when nothing changes with it; None when something else
    does, or the model takes none of the changed values. A depth of a class below (`variants`) goes into
    `handed`, the top's slots that pass it down into the result."""
    code, current = (name, value) if index is None else (f"{name}[{index}]", value[index])
    for other in changed(current):
        try:
            ported = again({name: other if index is None else
                            type(value)([*value[:index], other, *value[index + 1:]])})
        except Exception:  # noqa: BLE001 - the model refuses the changed value: try the next
            continue
        if ported is None:
            return None
        variant = ported[0]
        if ported[1] != below:  # it moves classes below: a depth handed down, else a literal
            return _handed(top, slots, below, variants, ported, name, current, other, handed) \
                if index is None and handed is not None and len(ported) > 2 else None
        found = follow(slots, dict(port_code.slots(variant.instances[0], ())), code, current, other) \
            if variant.construct == top.construct else None
        if found:
            return found
        runs = port_depth.grown(top.instances[0], top.construct, variant.instances[0], variant.construct, code,
                                current, other)  # a depth: lists of the top class's layers grow with it
        return runs if runs is not None else found
    return None


def _handed(top: Any, slots: Dict[Tuple, Any], below: List[str], variants: Sequence[Any], ported: Tuple[Any, ...],
            name: str, value: Any, other: Any, handed: List[port_nested.HandedDown]) -> Optional[Dict[Tuple, Any]]:
    """The top's slots of a depth it hands to classes below (their changes put in `handed`); None unless the top
    class itself is unchanged but for literals following the argument."""
    variant = ported[0]
    if variant.construct != top.construct:
        return None
    found = follow(slots, dict(port_code.slots(variant.instances[0], ())), name, value, other)
    if found is None:
        return None
    down = port_nested.handed_down(top, variants, ported[2], below, ported[1], name, value, other)
    if down is None:
        return None
    handed.append(down)
    return {**found, **down.top}


def changed(value: Any) -> Tuple[Any, ...]:
    """Other values of an argument to see what follows it, in turn until the model takes one (a width that
    must divide by the number of heads refuses ``+ 1``, takes ``* 2``)."""
    return (value + 1, value * 2) if isinstance(value, int) else (value + 0.125,)


def expression(before: Any, after: Any, name: str, value: Any, other: Any) -> Optional[str]:
    """The code of a literal that was `before` with the argument `name` = `value` and `after` with `other`:
    ``name``, ``k * name``, a tuple of those and constants; None when it does not follow the argument so."""
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        parts = [port_code.literal(b) if b == a else expression(b, a, name, value, other)
                 for b, a in zip(before, after)]
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
