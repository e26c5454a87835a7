"""Depths as the top-level Cell's constructor arguments: a run of identical blocks built ``depth`` times.

A model built as ``ViT(depth=2)`` lists its blocks; ported literally, the top class would list two ``Block(...)``
calls and ``depth`` would be a number nobody can change. :mod:`trainkit.bridge.port.arguments` finds an argument by
building the model again with it changed (``2`` -> ``3``); where that changes no literal but the length of lists of
the top class's layers (a ``nn.Sequential``'s, a ``nn.ModuleList``'s, ``nn.TransformerEncoder``'s layers), each by
as much as the argument, and each longer list is the shorter one with its last item repeated, the list is a
:class:`Run`: its first items as they are, then the identical tail written as
``[Block(...) for _ in range(depth)]`` (``range(depth - 1)`` after a first block with a stride). The items keep their
places, so every parameter keeps its name (``blocks.0.attn.qkv.weight``); an OrderedDict's items named
``encoder_layer_0``... are written ``(f"encoder_layer_{i}", EncoderBlock()) for i in range(depth)``. The same Runs
build the lists of a class below that the top class hands the argument to (:mod:`trainkit.bridge.port.nested`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from trainkit.bridge.port import code as port_code
from trainkit.bridge.port.code import signature, slots
from trainkit.bridge.port.layers import Call

LINE = 116
# one line of construct calling one item of a CellList: ``x = self.blocks[1](blocks)`` (then any further arguments)
ITEM_CALL = re.compile(r"^(?P<indent>\s*)(?P<out>\w+) = self\.(?P<list>\w+)\[(?P<index>\d+)\]"
                       r"\((?P<input>\w+)(?P<rest>.*)\)$")


@dataclass(frozen=True)
class Run:
    """A list of a generated class written as its first `head` items, then its last item `count` times."""

    argument: str  # the code of the constructor argument it follows: ``depth``, ``layers[0]``
    value: int  # the argument's value in the model ported
    head: int
    count: str  # the code of how many: ``depth``, ``depth - 1``
    length: int  # the list's length in the model ported
    prefix: Optional[str] = None  # items named prefix + index (an OrderedDict's): ``encoder_layer_``

    def render(self, items: List[Any], path: Tuple, render: Callable[[Any, Tuple, int], str], indent: int) -> str:
        """``[First(...)] + [Block(...) for _ in range(depth - 1)]``; `render` writes one item at its path."""
        pad = " " * (indent + 4)
        heads = [render(item, path + (index,), indent + 4) for index, item in enumerate(items[:self.head])]
        if self.prefix is None:
            block = render(items[self.head], path + (self.head,), indent + 4)
            loop = f"for _ in range({self.count})"
        else:  # (f"encoder_layer_{i}", EncoderBlock()) for i in range(num_layers): each item keeps its name
            block = render(items[self.head].args[1], path + (self.head, 1), indent + 4)
            index = "i" if not re.search(r"\bi\b", block) else "index"
            prefix = str.__str__(self.prefix)  # PyTorch's names: into an f-string only when plain ASCII
            name = f'f"{prefix}{{{index}}}"' if re.fullmatch(r"[\w.\-]*", prefix, flags=re.ASCII) \
                else f"{port_code.literal(prefix)} + str({index})"
            offset = self.length - self.value
            stop = self.argument if not offset else f"{self.argument} {'+' if offset > 0 else '-'} {abs(offset)}"
            block, loop = f"({name}, {block})", f"for {index} in range({f'{self.head}, ' if self.head else ''}{stop})"
        first = f"[{', '.join(heads)}] + " if heads else ""
        if len(first) + indent + 16 > LINE or "\n" in first:
            first = "[\n" + ",\n".join(pad + head for head in heads) + "] + "
        line = f"{first}[{block} {loop}]"
        if len(line) + indent + 16 <= LINE and "\n" not in line:
            return line
        run = f"[{block} {loop}]"
        if first and "\n" not in first + run and len(run) + indent + 4 <= LINE:  # the loop on a line of its own
            return f"{first[:-3]}\n{' ' * indent}+ {run}"
        return f"{first}[\n{pad}{block}\n{pad}{loop}]"


def grown(before: Dict[str, Any], construct: List[str], after: Dict[str, Any], construct_after: List[str],
           name: str, value: Any, other: Any) -> Optional[Dict[Tuple, Run]]:
    """The Runs of the top class's children `before` (``construct`` its forward) that `after` (the model built
    with the argument `name` = `other` rather than `value`) shows grown with it; None unless that is all it changed.
    A CellList's items called in turn (fx unrolls ``for block in self.blocks``) count as its loop."""
    found = runs(before, after, name, value, other)
    if found is None:
        return None
    lengths = loops(found)
    if roll(construct, lengths) != roll(construct_after, {attribute: length + other - value
                                                          for attribute, length in lengths.items()}):
        return None
    return found


def loops(found: Dict[Tuple, Any]) -> Dict[str, int]:
    """attribute -> length of the Runs that are a child's whole list (``self.blocks = nn.CellList([...])``)."""
    return {path[0]: run.length for path, run in found.items() if isinstance(run, Run) and len(path) == 2
            and path[1] == 0 and isinstance(path[0], str)}


def roll(construct: List[str], lengths: Dict[str, int]) -> List[str]:
    """`construct` with each CellList of `lengths` called item by item, each on the one before's output (what fx
    writes for ``for block in self.blocks: x = block(x)``), written as that loop again."""
    lines, index = [], 0
    while index < len(construct):
        chain = _chain(construct, index, lengths)
        if not chain:
            lines.append(construct[index])
            index += 1
            continue
        first, last = chain[0], chain[-1]
        plural = first["list"]  # ``for layer in self.layers``, else ``for block in self.stage``
        indent, out = first["indent"], last["out"]
        loop = _free(plural[:-1] if plural.endswith("s") and not plural.endswith("ss") else "block", construct)
        if out != first["input"]:
            lines.append(f"{indent}{out} = {first['input']}")
        lines += [f"{indent}for {loop} in self.{first['list']}:", f"{indent}    {out} = {loop}({out}{first['rest']})"]
        index += len(chain)
    return lines


def _chain(construct: List[str], start: int, lengths: Dict[str, int]) -> List[Any]:
    """The matches of the lines from `start` that call a whole CellList of `lengths` in turn; [] if they do not."""
    chain = []
    for line in construct[start:]:
        match = ITEM_CALL.match(line)
        if not match or match["list"] not in lengths or int(match["index"]) != len(chain) \
                or chain and (match["input"] != chain[-1]["out"] or match["rest"] != chain[0]["rest"]
                              or match["indent"] != chain[0]["indent"]):
            break
        chain.append(match)
        if len(chain) == lengths[match["list"]]:
            break
    if not chain or len(chain) != lengths[chain[0]["list"]]:
        return []
    after = "\n".join(construct[start + len(chain):])
    inner = {match["out"] for match in chain[:-1]} - {chain[-1]["out"]}
    if any(re.search(rf"\b{name}\b", after + chain[0]["rest"]) for name in inner):
        return []  # an output in between is used later: not a plain loop
    return chain


def _free(name: str, construct: List[str]) -> str:
    """`name`, else ``name2``...: a variable no line of `construct` uses."""
    text, candidate, count = "\n".join(construct), name, 1
    while re.search(rf"\b{candidate}\b", text):
        count += 1
        candidate = f"{name}{count}"
    return candidate


def key(item: Any) -> Tuple[Any, str]:
    """What makes two items the same block: their classes and layers, and every literal of their constructors."""
    return signature(item), repr(slots(item, ()))


def runs(before: Any, after: Any, name: str, value: Any, other: Any) -> Optional[Dict[Tuple, Run]]:
    """list path -> Run for the lists of the top class's children `before` (the argument `name` = `value`) that
    grew with it in `after` (`other`); None when anything else differs, or when nothing grew."""
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(other, int) or other <= value:
        return None
    found: Dict[Tuple, Run] = {}
    if not _walk(before, after, (), name, other - value, value, found) or not found:
        return None
    return found


def _walk(before: Any, after: Any, path: Tuple, name: str, grown: int, value: int, found: Dict[Tuple, Run]) -> bool:
    """Whether `after` is `before` with some lists grown by `grown` items (recorded in `found`), nothing else."""
    if isinstance(before, dict) or isinstance(after, dict):
        return isinstance(before, dict) and isinstance(after, dict) and list(before) == list(after) \
            and all(_walk(before[key], after[key], path + (key,), name, grown, value, found) for key in before)
    if isinstance(before, Call) and "__instance__" in before.kwargs \
            or isinstance(after, Call) and "__instance__" in after.kwargs:
        return key(before) == key(after)  # an instance of a class below: its class and its arguments
    if isinstance(before, Call) or isinstance(after, Call):
        return isinstance(before, Call) and isinstance(after, Call) and before.callee == after.callee \
            and len(before.args) == len(after.args) and list(before.kwargs) == list(after.kwargs) \
            and all(_walk(b, a, path + (index,), name, grown, value, found)
                    for index, (b, a) in enumerate(zip(before.args, after.args))) \
            and all(_walk(before.kwargs[k], after.kwargs[k], path + (k,), name, grown, value, found)
                    for k in before.kwargs)
    if isinstance(before, list) and isinstance(after, list):
        if len(before) == len(after):
            return all(_walk(b, a, path + (index,), name, grown, value, found)
                       for index, (b, a) in enumerate(zip(before, after)))
        run = _run(before, after, name, grown, value)
        if run is None:
            return False
        found[path] = run
        return True
    return type(before) is type(after) and repr(before) == repr(after)


def _run(before: List[Any], after: List[Any], name: str, grown: int, value: int) -> Optional[Run]:
    """The Run of `before` when `after` is it with its last item repeated `grown` more times (for an
    OrderedDict's items, each named its prefix and its index from the first repeated one on)."""
    if not before or len(after) != len(before) + grown:
        return None
    prefix = _prefix(before) if all(_pair(item) for item in before + after) else None
    if prefix is not None:
        names = [item.args[0] for item in after]
        before, after = [item.args[1] for item in before], [item.args[1] for item in after]
    keys = [key(item) for item in before]
    if [key(item) for item in after] != keys + [keys[-1]] * grown:
        return None
    head = len(keys)
    while head and keys[head - 1] == keys[-1]:
        head -= 1
    if prefix is not None:
        while head < len(keys) and names[head] != f"{prefix}{head}":
            head += 1  # named otherwise: listed as it is
        if head == len(keys) or names[head:] != [f"{prefix}{index}" for index in range(head, len(names))]:
            return None
    return _counted(name, head, len(keys), value, prefix)


def _pair(item: Any) -> bool:
    """An OrderedDict's item as port_source writes it: ``("name", Block(...))``."""
    return isinstance(item, Call) and item.callee == "" and len(item.args) == 2 and isinstance(item.args[0], str)


def _prefix(items: List[Any]) -> Optional[str]:
    """``encoder_layer_`` where the last item is named ``encoder_layer_1`` at index 1."""
    last, index = items[-1].args[0], str(len(items) - 1)
    return last[:-len(index)] if last.endswith(index) else None


def _counted(name: str, head: int, length: int, value: int, prefix: Optional[str] = None) -> Run:
    """The Run of a list of `length` items, the last `length - head` of them repeated as `name` (= `value`) says."""
    offset = length - head - value
    return Run(name, value, head, name if not offset else f"{name} {'+' if offset > 0 else '-'} {abs(offset)}",
               length, prefix)


def settle(driven: Dict[Tuple, Any]) -> None:
    """Move the start of each Run of `driven` (slot path -> code or Run) past the blocks another argument drives
    differently from the rest (``hidden`` the first block's input, the others' a constant): one block written
    `count` times would get those wrong, so they are listed ahead of the loop."""
    for path, run in list(driven.items()):
        if not isinstance(run, Run):
            continue
        codes: Dict[int, Dict[Tuple, Any]] = {index: {} for index in range(run.head, run.length)}
        for slot, code in driven.items():
            if len(slot) > len(path) and slot[:len(path)] == path and isinstance(slot[len(path)], int) \
                    and slot[len(path)] >= run.head:
                codes[slot[len(path)]][slot[len(path) + 1:]] = code
        head = run.length - 1
        last = sorted(codes[run.length - 1].items(), key=repr)
        while head > run.head and sorted(codes[head - 1].items(), key=repr) == last:
            head -= 1
        driven[path] = _counted(run.argument, head, run.length, run.value, run.prefix)
