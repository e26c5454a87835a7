"""Names for the variables of a generated ``construct``: what the PyTorch source called them, not torch.fx's.

fx names a node after its operation (``getitem_3``, ``add_1``, ``chunk``). The trace records the source line each
node came from; where that line assigns (``q, k, v = self.qkv(x).chunk(3, dim=-1)``), the node that completes it
takes the assigned name (``q``, ``k``, ``v``), and the steps inside the line are named for what they hold: a
submodule's output after the submodule (``qkv``), a shape ``shape``, the rest after the line's target (``x``). A
name is reused once the value it held is no longer needed (``x = self.norm(x)``), else numbered (``x_2``).
"""
from __future__ import annotations

import keyword
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from trainkit.checks.generated_code import FORBIDDEN

#: Names the generated module uses itself, or that its check refuses (``open``, ``vars``): never a variable's.
RESERVED = set(FORBIDDEN) | {
    "self", "ms", "nn", "ops", "math", "Parameter", "initializer", "Normal", "Uniform", "Dropout", "DropPath",
    "OrderedDict", "getattr", "setattr", "float", "int", "len", "range", "tuple", "list", "super", "print",
    "isinstance", "None", "True", "False"}
_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*,?\s*(?:[-+*/@%&|^]|//|\*\*)?=(?!=)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\s*$')


def source_line(stack_trace: Optional[str]) -> Optional[Tuple[str, str]]:
    """(where, code) of the model's own line a node came from: the last frame outside torch and outside the port
    (whose tracer computes values as it records, in a frame of its own)."""
    if not stack_trace:
        return None
    import torch

    bridge = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the port and the rest of the bridge
    outside = (os.path.dirname(torch.__file__), bridge)
    lines = stack_trace.splitlines()
    found = None
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if match and not match.group("file").startswith(outside) and index + 1 < len(lines):
            found = (f"{match.group('file')}:{match.group('line')}", lines[index + 1].strip())
    return found


def assigned(code: str) -> List[str]:
    """The names a line of source assigns (``["q", "k", "v"]``), none for anything else."""
    match = _ASSIGN.match(code)
    if not match or code.lstrip().startswith(("return ", "if ", "for ", "while ", "with ", "assert ")):
        return []
    return [name.strip() for name in match.group(1).split(",")]


def identifier(name: str) -> str:
    """`name` made an ASCII Python name that is not one the generated module uses itself (ASCII: Python would
    NFKC-normalise other letters, and two names could become one)."""
    name = re.sub(r"\W", "_", name, flags=re.ASCII)
    if not name or name[0].isdigit() or name.startswith("__") and name.endswith("__"):
        name = f"x_{name}"
    return f"{name}_" if keyword.iskeyword(name) or name in RESERVED else name


class Namer:
    """Names the nodes of one fx graph in order; `reserved` adds the generated module's own names (helpers)."""

    def __init__(self, nodes: List[Any], reserved: Tuple[str, ...] = ()):
        self.position = {node: index for index, node in enumerate(nodes)}
        self.last_use = {node: max((self.position[user] for user in node.users), default=-1) for node in nodes}
        self.reserved = RESERVED | set(reserved)
        self.bound: Dict[str, Any] = {}
        self.lines = {node: source_line(node.meta.get("stack_trace") or getattr(node, "stack_trace", None))
                      for node in nodes}
        # the node that completes its line: the last of a run of consecutive nodes from one line
        self.completes = {node: index + 1 == len(nodes) or self.lines[nodes[index + 1]] != self.lines[node]
                          or self.lines[node] is None for index, node in enumerate(nodes)}

    def name(self, node: Any) -> str:
        """`node`'s variable: the desired name, or it numbered while another live value holds it."""
        desired = identifier(self.desired(node))
        candidate, count = desired, 1
        while not self._free(candidate, node):
            count += 1
            candidate = f"{desired}_{count}"
        self.bound[candidate] = node
        return candidate

    def _free(self, name: str, node: Any) -> bool:
        if name in self.reserved:
            return False
        holder = self.bound.get(name)
        return holder is None or self.last_use[holder] <= self.position[node]

    def desired(self, node: Any) -> str:
        if node.op == "placeholder":
            return str(node.target)
        line = self.lines.get(node)
        targets = assigned(line[1]) if line else []
        if len(targets) > 1 and _is_index(node) and self.lines.get(node.args[0]) == line \
                and node.args[1] < len(targets):
            return targets[node.args[1]]
        if targets and self.completes[node] and len(targets) == 1:
            return targets[0]
        if node.op == "call_module":
            parts = [part for part in str(node.target).split(".") if not part.isdigit()]
            return parts[-1] if parts else "x"
        if node.op == "call_method" and node.target == "size" or _attribute(node) == "shape":
            return "shape" if _attribute(node) == "shape" or len(node.args) == 1 else "size"
        if targets:
            return "_".join(targets)
        return "x"


def _is_index(node: Any) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "") == "getitem" \
        and isinstance(node.args[1], int)


def _attribute(node: Any) -> Optional[str]:
    if node.op == "call_function" and getattr(node.target, "__name__", "") == "getattr":
        return str(node.args[1])
    return None
