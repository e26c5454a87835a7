"""A depth handed down: the top class's argument builds the blocks of a class below it.

torchvision's ``VisionTransformer(num_layers=12)`` passes ``num_layers`` to its ``Encoder``, which builds that many
``EncoderBlock``s; timm's stage classes take their ``depth`` the same way. Rebuilt with the argument changed, such a
model's top class is unchanged and a class below has longer lists (:mod:`trainkit.bridge.port.depth`). The class
with the lists then takes the argument (``def __init__(self, num_layers=2)``) and builds them as a
:class:`~trainkit.bridge.port.depth.Run`; each class between it and the top takes the argument too and hands it
on (``self.encoder = Encoder(num_layers=num_layers)``). Every item keeps its place and its name, so every
parameter keeps its ``state_dict`` name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trainkit.bridge.port import depth as port_depth
from trainkit.bridge.port.layers import Call


@dataclass
class HandedDown:
    """What the argument `name` changes: the top's slots (the argument passed to a child) and, per class below,
    its lists (Runs) and the slots it passes on."""

    name: str
    value: int
    top: Dict[Tuple, str]
    below: List[Tuple[Any, Dict[Tuple, Any]]] = field(default_factory=list)  # (Variant, slot path -> Run or code)

    def apply(self) -> None:
        """Give each class below its argument, its Runs and its passing on (once the top keeps the argument)."""
        for variant, driven in self.below:
            variant.driven.update(driven)
            variant.arguments[self.name] = self.value
            merged = {**{path: code for path, code in variant.parameters}, **variant.driven}
            port_depth.settle(merged)  # blocks an instance's own value drives apart go ahead of the loop
            variant.driven.update({path: run for path, run in merged.items() if path in variant.driven})
            variant.construct = port_depth.roll(variant.construct, port_depth.loops(variant.driven))


def handed_down(top: Any, before: Sequence[Any], after: Sequence[Any], sources: Sequence[str],
                sources_after: Sequence[str], name: str, value: Any, other: Any) -> Optional[HandedDown]:
    """How the argument `name` (`value`, `other` in the model rebuilt) reaches lists of the classes below the
    top: `before` and `after` are those classes (Variants) in the model ported and in the rebuilt one, `sources`
    and `sources_after` their code (a class of the same code is unchanged, though its blocks are more). None when
    anything else changed, or a class would take a name it has already."""
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(other, int) or other <= value \
            or [variant.name for variant in before] != [variant.name for variant in after]:
        return None
    runs: Dict[str, Dict[Tuple, Any]] = {}  # variant name -> its Runs
    for old, new, source, source_after in zip(before, after, sources, sources_after):
        if source == source_after:
            continue
        grown = _grown(old, new, name, value, other)
        if not grown:  # None (something else changed) or no list grew
            return None
        runs[old.name] = grown
    if not runs:
        return None
    needing = set(runs)
    while True:  # the classes that hold an instance of one needing the argument need it, to hand it on
        more = {variant.name for variant in before if _instances(variant.children, (), needing)} - needing
        if not more:
            break
        needing |= more
    handed = HandedDown(name, value, {path + (name,): name for path in _instances(top.children, (), needing)})
    if not handed.top:
        return None
    for variant in before:
        if variant.name not in needing:
            continue
        taken = {parameter for _, parameter in variant.parameters} | set(variant.arguments) | set(variant.children)
        if name in taken:
            return None
        driven = dict(runs.get(variant.name, {}))
        driven.update({path + (name,): name for path in _instances(variant.children, (), needing)})
        if set(driven) & set(variant.driven):
            return None
        handed.below.append((variant, driven))
    return handed


def _grown(old: Any, new: Any, name: str, value: int, other: int) -> Optional[Dict[Tuple, Any]]:
    """The Runs of class `old` whose every instance is its `new` one with the same lists grown; None when
    anything else differs."""
    if old.torch_class != new.torch_class or len(old.instances) != len(new.instances) \
            or old.parameters != new.parameters:
        return None
    found = []
    for before, after in zip(old.instances, new.instances):
        runs: Dict[Tuple, Any] = {}
        if not port_depth._walk(before, after, (), name, other - value, value, runs):
            return None
        found.append(runs)
    if any(runs != found[0] for runs in found):
        return None  # the instances grew differently: not one class's argument
    lengths = port_depth.loops(found[0])
    if port_depth.roll(old.construct, lengths) != port_depth.roll(
            new.construct, {attribute: length + other - value for attribute, length in lengths.items()}):
        return None
    return found[0]


def _instances(value: Any, path: Tuple, names: set) -> List[Tuple]:
    """The slot paths of the instances of the classes `names` in `value` (a class's children)."""
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _instances(item, path + (key,), names)]
    if isinstance(value, Call):
        if "__instance__" in value.kwargs:
            return [path] if value.kwargs["__instance__"][0].name in names else []
        return [found for index, arg in enumerate(value.args) for found in _instances(arg, path + (index,), names)] \
            + [found for key, arg in value.kwargs.items() for found in _instances(arg, path + (key,), names)]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _instances(item, path + (index,), names)]
    return []

