"""The code of one traced ``forward`` line's pieces: arguments as code, dtypes, the nodes no line needs, and
which torch containers are written as MindSpore's (helpers of :mod:`trainkit.bridge.port_source`)."""
from __future__ import annotations

from typing import Any, Dict, List

from trainkit.bridge import port_transformers
from trainkit.bridge.port_layers import Unsupported, target_name


def dead(graph: Any) -> set:
    """The nodes no written line needs: shape checks (``torch._assert`` and what only it uses), unused values
    (``x, _ = ...``). Submodule calls stay."""
    dead: set = set()
    for node in reversed(list(graph.nodes)):
        skipped = node.op == "call_function" and target_name(node.target) in port_transformers.SKIPPED
        unused = node.op in ("call_function", "call_method", "get_attr") and all(user in dead for user in node.users)
        if skipped or unused:
            dead.add(node)
    return dead


def container(module: Any) -> str:
    """``Sequential`` or ``ModuleList`` for those and for subclasses that keep their forward (torchvision's MLP)."""
    import torch

    for base in (torch.nn.Sequential, torch.nn.ModuleList):
        if isinstance(module, base) and type(module).forward is base.forward:
            return base.__name__
    return ""


def attribute(target: str) -> str:
    """``self.layers[0]`` for fx's ``layers.0``."""
    code = "self"
    for part in target.split("."):
        code += f"[{part}]" if part.isdigit() else f".{part}"
    return code


def keywords(kwargs: Dict[str, str]) -> List[str]:
    return [f"{key}={value}" for key, value in kwargs.items()]


def code(value: Any, names: Dict[Any, str]) -> str:
    """A traced argument as code: a node's variable, a literal, a slice, or a container of them."""
    if value in names if hashable(value) else False:
        return names[value]
    if isinstance(value, tuple):
        items = [code(item, names) for item in value]
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(value, list):
        return f"[{', '.join(code(item, names) for item in value)}]"
    if isinstance(value, slice):
        parts = ["" if part is None else code(part, names) for part in (value.start, value.stop, value.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if parts[2] else "")
    if value is Ellipsis:
        return "..."
    if type(value).__name__ == "dtype" and type(value).__module__.startswith("torch"):
        return dtype(value)
    if type(value).__name__ == "device" and type(value).__module__.startswith("torch"):
        return "None"
    if type(value).__module__.startswith("torch"):
        raise Unsupported(f"a {type(value).__name__} constant")
    return repr(value)


class Code(str):
    """Written into the source as it is (``ms.int64``), not as a string literal."""


def dtype(dtype: Any) -> str:
    """``ms.float32`` for ``torch.float32``."""
    name = str(dtype).replace("torch.", "")
    if name not in port_transformers.DTYPES:
        raise Unsupported(f"dtype {dtype}")
    return port_transformers.DTYPES[name]


def hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return type(value).__name__ == "Node"
