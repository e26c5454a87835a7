"""Random operators inside a network, whose state a checkpoint cannot hold.

MindSpore 2.10's random kernels on CPU (``ops.Dropout`` behind ``nn.Dropout``, ``Dropout2D``, ``UniformReal``...)
take their seeds as attributes fixed when the graph is built and keep their position in the stream inside the
kernel: nothing reads it or sets it, so a resumed run's dropout masks restart from the stream's beginning. The
operators that use ``mindspore.Generator`` (``mint.nn.Dropout``, whose state ``get_rng_state`` would give) have no
CPU kernel in 2.10. A resume therefore names these layers and says it is not exact for them.
"""
from __future__ import annotations

from typing import List

from mindspore import nn


def unrestorable_random_layers(network: nn.Cell) -> List[str]:
    """``name (Primitive)`` of each cell of `network` holding a seeded random operator that is switched on."""
    found = []
    for name, cell in network.cells_and_names():
        if getattr(cell, "p", None) == 0 or getattr(cell, "keep_prob", None) == 1:  # nn.Dropout(p=0): the identity
            continue
        # Cell.__setattr__ keeps a cell's operators in _primitives; there is no public accessor.
        for primitive in getattr(cell, "_primitives", {}).values():
            attrs = getattr(primitive, "attrs", {}) or {}
            if any(key.lower().startswith("seed") for key in attrs):
                found.append(f"{name or type(cell).__name__} ({primitive.name})")
                break
    return found
