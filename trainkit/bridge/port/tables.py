"""What ``port`` writes for each PyTorch thing, in one place: the tables of :mod:`~trainkit.bridge.port.layers`
(layers, functions, methods), :mod:`~trainkit.bridge.port.transformers` (attention, dropout, einsum),
:mod:`~trainkit.bridge.port.windows` (Swin), :mod:`~trainkit.bridge.port.buffers` and
:mod:`~trainkit.bridge.port.classes` (timm's and torchvision's own classes), merged.
"""
from __future__ import annotations

from typing import Any

from trainkit.bridge.port import buffers as port_buffers
from trainkit.bridge.port import layers as port_layers
from trainkit.bridge.port import operators as port_operators
from trainkit.bridge.port import transformers as port_transformers
from trainkit.bridge.port import windows as port_windows
from trainkit.bridge.port.classes import HELPERS as CLASS_HELPERS
from trainkit.bridge.port.layers import Call, Unsupported

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
