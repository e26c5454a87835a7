"""PyTorch for the bridge: ``import torch``, with torchvision (and so timm and transformers) importable after it.

The package index's ``torchvision==0.28.0`` is built against a CUDA torch: its C++ operators (``_C``) do not load
against ``torch==2.13.0+cpu``, and then ``import torchvision`` stops on ``operator torchvision::nms does not
exist`` (its Python code registers fake kernels for ``nms`` and ``qnms``, which need the operators' schemas). The
models use none of its C++ operators, so defining those two schemas is enough: :func:`import_torch` does it once
per process, and only where torchvision is installed and its own operators did not load. Where they load (a
matching torchvision), nothing is defined: a second definition would make torchvision's own registration fail.

``port``, ``compare``, ``convert`` and ``export --to torch`` import PyTorch through :func:`import_torch`, so a
model module they import (``timm:create_model``, ``torchvision.models:resnet18``, a module importing
transformers) imports in their process as it would beside a matching torchvision.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

#: The schemas of the operators torchvision's Python code registers fake kernels for at import.
TORCHVISION_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                       "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

_library: Optional[Any] = None  # the torch.library.Library holding the schemas: they live as long as it does


def import_torch() -> ModuleType:
    """``torch``, with torchvision's operator schemas defined where its own C++ operators do not load.

    Raises:
        ImportError: PyTorch is not installed (the callers say which extra installs it).
    """
    import torch

    _define_torchvision_schemas(torch)
    return torch


def torchvision_schemas_defined() -> bool:
    """Whether this process defined torchvision's schemas (its own operators did not load)."""
    return _library is not None


def _define_torchvision_schemas(torch: ModuleType) -> None:
    global _library
    if _library is not None or _has_nms(torch):
        return
    spec = importlib.util.find_spec("torchvision")  # imports nothing: a top-level name
    if spec is None or not spec.submodule_search_locations:
        return  # no torchvision: nothing to make importable
    extension = _extension(Path(next(iter(spec.submodule_search_locations))))
    if extension is not None:
        # what `import torchvision` does first (loading it twice is loading it once); OSError: built for another
        # torch (a CUDA one), its operators are not there
        with contextlib.suppress(OSError, RuntimeError):
            torch.ops.load_library(str(extension))
    if _has_nms(torch):
        return
    library = torch.library.Library("torchvision", "DEF")
    for schema in TORCHVISION_SCHEMAS:
        library.define(schema)
    _library = library


def _has_nms(torch: ModuleType) -> bool:
    try:
        torch.ops.torchvision.nms  # noqa: B018 - raises where the operator is not registered
    except (AttributeError, RuntimeError):
        return False
    return True


def _extension(folder: Path) -> Optional[Path]:
    """torchvision's ``_C`` library in `folder`, as torchvision itself finds it (by the extension suffixes)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"_C{suffix}"
        if path.is_file():
            return path
    return None
