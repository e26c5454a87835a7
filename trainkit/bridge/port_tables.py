"""What ``port`` writes for each PyTorch thing, in one place: the tables of :mod:`~trainkit.bridge.port_layers`
(layers, functions, methods), :mod:`~trainkit.bridge.port_transformers` (attention, dropout, einsum),
:mod:`~trainkit.bridge.port_windows` (Swin), :mod:`~trainkit.bridge.port_buffers` and
:mod:`~trainkit.bridge.port_classes` (timm's and torchvision's own classes), merged.
"""
from __future__ import annotations

from typing import Any

from trainkit.bridge import port_buffers, port_layers, port_operators, port_transformers, port_windows
from trainkit.bridge.port_classes import HELPERS as CLASS_HELPERS
from trainkit.bridge.port_layers import Call, Unsupported

# port_transformers' entries take precedence over port_layers' where both name one (attention, dropout)
# port_operators' (transformers models': softmax with a dtype) over port_layers'
FUNCTIONS = {**port_layers.FUNCTIONS, **port_operators.FUNCTIONS, **port_transformers.FUNCTIONS,
             **port_windows.FUNCTIONS}
METHODS = {**port_layers.METHODS, **port_operators.METHODS, **port_transformers.METHODS, **port_windows.METHODS}
HELPERS = {**port_layers.HELPERS, **port_operators.HELPERS, **port_transformers.HELPERS, **CLASS_HELPERS,
           **port_windows.HELPERS,
           **port_buffers.HELPERS}
HELPER_IMPORTS = {**port_layers.HELPER_IMPORTS, **port_transformers.HELPER_IMPORTS, **port_windows.HELPER_IMPORTS,
                  **port_buffers.HELPER_IMPORTS}
FUNCTION_HELPERS = {**port_operators.FUNCTION_HELPERS, **port_transformers.FUNCTION_HELPERS,
                    **port_windows.FUNCTION_HELPERS}
HELPER_NEEDS = {**port_transformers.HELPER_NEEDS, **port_windows.HELPER_NEEDS}


def layer_call(module: Any) -> Call:
    """The MindSpore constructor call of a torch.nn layer (port_transformers' tables first, then port_layers')."""
    name = type(module).__name__
    if name in port_transformers.LAYERS and type(module).__module__.startswith("torch.nn"):
        try:
            return port_transformers.LAYERS[name](module)
        except Unsupported as error:
            raise Unsupported(f"torch.nn.{name} with {error}") from error
    return port_layers.layer_call(module)
