"""Tied weights: one PyTorch ``Parameter`` held by two modules (a language model's output layer sharing the token
embedding's table, ``tie_word_embeddings``) stays one MindSpore ``Parameter``.

PyTorch's ``state_dict`` lists such a parameter under each of its names; ``named_parameters()`` under the first
only. The ported top class builds both layers, then hands the second the first one's Parameter
(``self.lm_head.weight = self.transformer.wte.weight``): MindSpore names it after the first, trains it once, and a
checkpoint keeps it once, as PyTorch's ``named_parameters()`` does.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from trainkit.bridge.port.layers import Unsupported

#: torch.nn layers whose parameters MindSpore names otherwise (gamma/beta): a tie between them is not written
_RENAMED = ("BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm")


def tied_parameters(model: Any) -> List[Tuple[str, str]]:
    """(alias, first name) for each parameter of `model` that a second module holds too, in PyTorch's order."""
    first: Dict[int, str] = {}
    ties = []
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            ties.append((name, first[id(parameter)]))
        else:
            first[id(parameter)] = name
    return ties


def _attribute(model: Any, name: str) -> str:
    """``self.transformer.h[0].weight`` for the parameter `name` (an item of a list or sequence by index)."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    if type(module).__name__.startswith(_RENAMED) and type(module).__module__.startswith("torch.nn"):
        raise Unsupported(f"the tied parameter {name} of a {type(module).__name__}")
    code = "self"
    for part in name.split("."):
        if part.isdigit():
            code += f"[{part}]"
        elif part.isidentifier():
            code += f".{part}"
        else:
            raise Unsupported(f"the tied parameter {name} (a name that is no Python attribute)")
    return code


def tie_lines(model: Any) -> List[str]:
    """The top class's lines making each alias its first name's Parameter (Unsupported where one cannot be)."""
    return [f"{_attribute(model, alias)} = {_attribute(model, name)}  # tied: one Parameter, as in PyTorch"
            for alias, name in tied_parameters(model)]
