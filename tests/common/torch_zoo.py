"""torchvision and timm, imported as trainkit's bridge imports them (:func:`trainkit.bridge.torch_import.import_torch`
defines torchvision's two operator schemas where its C++ operators do not load against this torch)."""
from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")


@functools.lru_cache(maxsize=1)
def import_zoo():
    """(torchvision, timm), imported once; skips the calling test where either is not installed."""
    from trainkit.bridge.torch_import import import_torch

    import_torch()
    torchvision = pytest.importorskip("torchvision")
    timm = pytest.importorskip("timm")
    return torchvision, timm
