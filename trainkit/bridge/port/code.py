"""The code of one traced ``forward`` line's pieces: arguments as code, dtypes, the nodes no line needs, and
which torch containers are written as MindSpore's; the constructor slots of a generated class and their
parameter names (helpers of :mod:`trainkit.bridge.port.source`)."""
from __future__ import annotations

import ast
import keyword
import numbers
from typing import Any, Dict, List, Tuple

from trainkit.bridge.port import transformers as port_transformers
from trainkit.bridge.port.layers import Call, Unsupported, target_name
from trainkit.bridge.port.names import identifier
from trainkit.errors import ConfigError


class UnsafeName(ConfigError):
    """A name of the model's that cannot be written as a name of the generated code: refused, nothing written."""


def safe_identifier(name: Any) -> bool:
    """Whether `name` can be written into the code as it is: an ASCII Python identifier, not a keyword (a
    non-ASCII one would be NFKC-normalised by Python, and no longer match the state_dict's name)."""
    return isinstance(name, str) and name.isascii() and name.isidentifier() and not keyword.iskeyword(name)


def literal(value: Any) -> str:
    """`value` (None, a bool, number, string, bytes, or a tuple, list or dict of those) as a Python literal built
    with ``ast``: the base type's value, whatever a subclass's ``__repr__`` says.

    Raises:
        Unsupported: any other type.
    """
    return ast.unparse(_constant(value))


def _constant(value: Any) -> ast.expr:
    if value is None or value is True or value is False or value is Ellipsis:
        return ast.Constant(value)
    if isinstance(value, str):
        return ast.Constant(str.__str__(value))  # a subclass's text, as an exact str
    if isinstance(value, bytes):
        return ast.Constant(bytes(memoryview(value)))
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return ast.Constant(int(int.__repr__(int(value))))
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return ast.Constant(float(float.__repr__(float(value))))
    if isinstance(value, tuple):
        return ast.Tuple([_constant(item) for item in tuple.__iter__(value)], ast.Load())
    if isinstance(value, list):
        return ast.List([_constant(item) for item in list.__iter__(value)], ast.Load())
    if isinstance(value, dict):
        items = list(dict.items(value))
        return ast.Dict([_constant(key) for key, _ in items], [_constant(item) for _, item in items])
    raise Unsupported(f"a constant of type {type(value).__name__}")


def comment(text: str) -> str:
    """``# text`` on one line, whatever `text` holds: line breaks become spaces, other unprintable characters
    their escapes."""
    return "# " + printable(" ".join(str.__str__(text).split()))


def printable(text: str) -> str:
    """`text` with its unprintable characters (line breaks, NUL) as their escapes: one line of a message."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in str.__str__(text))


def docstring(text: str, indent: int = 0) -> str:
    """`text` as a docstring (a string literal ``ast.unparse`` writes, triple-quoted where it can) at `indent`."""
    code = ast.unparse(ast.Module([ast.Expr(ast.Constant(str.__str__(text)))], []))
    return " " * indent + code


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
    """``Sequential`` or ``ModuleList`` for those and for subclasses that keep their forward and hold no tensors of
    their own (torchvision's MLP, Conv2dNormActivation, RegNet's AnyStage)."""
    import torch

    for base in (torch.nn.Sequential, torch.nn.ModuleList):
        if isinstance(module, base) and type(module).forward is base.forward:
            own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            return "" if own else base.__name__
    return ""


def attribute(target: str) -> str:
    """``self.layers[0]`` for fx's ``layers.0``."""
    code = "self"
    for index, part in enumerate(target.split(".")):
        if safe_identifier(part):
            code += f".{part}"
        elif part.isdigit() and index:  # an item of a container
            code += f"[{part}]"
        else:  # a child whose name is no identifier (torchvision's block1-0), as PyTorch names it
            code = f"getattr({code}, {part!r})"
    return code


def keywords(kwargs: Dict[str, str]) -> List[str]:
    """``key=code`` of a call's keyword arguments (Unsupported for a key that is no Python name)."""
    for key in kwargs:
        if not safe_identifier(key):
            raise Unsupported(f"a keyword argument named {key!r}")
    return [f"{key}={value}" for key, value in kwargs.items()]


def code(value: Any, names: Dict[Any, str]) -> str:
    """A traced argument as code: a node's variable, a literal, a slice, or a container of them (tuple, list, or a
    dict with constant keys)."""
    if value in names if hashable(value) else False:
        return names[value]
    if isinstance(value, tuple):
        items = [code(item, names) for item in value]
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(value, list):
        return f"[{', '.join(code(item, names) for item in value)}]"
    if isinstance(value, dict):  # fx's immutable_dict too: keys are constants, values may be traced
        return "{" + ", ".join(f"{literal(key)}: {code(item, names)}" for key, item in dict.items(value)) + "}"
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
    return literal(value)


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


def wrap(items: List[str], width: int) -> List[str]:
    """`items` joined into lines of at most `width` characters (for a long signature)."""
    lines: List[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(item) + 2 <= width:
            lines[-1] += f", {item}"
        else:
            lines.append(item)
    return lines


def signature(value: Any) -> Any:
    if isinstance(value, Call):
        if "__instance__" in value.kwargs:
            return value.kwargs["__instance__"][0].name
        # a layer given as an argument (timm's BatchNormAct2d(act=nn.ReLU())) is part of the signature, as a child
        return (value.callee, tuple((key, signature(arg)) for key, arg in value.kwargs.items()),
                tuple(signature(arg) for arg in value.args))
    if isinstance(value, list):
        return tuple(signature(item) for item in value)
    return None


def slots(value: Any, path: Tuple) -> List[Tuple[Tuple, Any]]:
    """(path, literal) of every constructor argument in `value` (children of one instance)."""
    if isinstance(value, dict):
        return [slot for key, item in value.items() for slot in slots(item, path + (key,))]
    if isinstance(value, Call):
        if "__instance__" in value.kwargs:
            variant, index = value.kwargs["__instance__"]
            values = dict(slots(variant.instances[index], ()))
            return [(path + (name,), values[slot]) for slot, name in variant.parameters]
        return [slot for index, arg in enumerate(value.args) for slot in slots(arg, path + (index,))] + \
            [slot for key, arg in value.kwargs.items() for slot in slots(arg, path + (key,))]
    if isinstance(value, list):
        return [slot for index, item in enumerate(value) for slot in slots(item, path + (index,))]
    return [(path, value)]


def parameter_name(path: Tuple, taken: set) -> str:
    name = identifier("_".join(str(part) for part in path))  # a child named 0 or block1-0: still a Python name
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{name}{count}"
    return candidate
