"""torchvision and timm from the package index, importable beside the CPU build of torch.

``torchvision==0.28.0`` on the index is built against a CUDA torch: its C++ operators do not load against
``torch==2.13.0+cpu`` and ``import torchvision`` stops on ``torchvision::nms``. Defining the two operator schemas
its Python code registers fake kernels for (``nms``, ``qnms``) before the import is enough for the models, which
use none of its C++ operators. ``import_zoo()`` does that once per process and returns both packages.
"""
from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")


@functools.lru_cache(maxsize=1)
def define_torchvision_schemas():
    """torchvision's ``nms`` and ``qnms`` schemas, defined once where its C++ operators did not define them
    (transformers imports torchvision too)."""
    try:
        torch.ops.torchvision.nms  # noqa: B018 -- defined already (a torchvision whose C++ ops load)
    except (AttributeError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        define_torchvision_schemas.library = library  # kept alive: the schemas go with the Library object


@functools.lru_cache(maxsize=1)
def import_zoo():
    """(torchvision, timm), imported once; skips the calling test where either is not installed."""
    define_torchvision_schemas()
    torchvision = pytest.importorskip("torchvision")
    timm = pytest.importorskip("timm")
    return torchvision, timm
