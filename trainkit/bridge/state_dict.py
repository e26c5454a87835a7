"""PyTorch weights read into NumPy: ``.safetensors`` without PyTorch, ``.pth``/``.pt``/``.bin`` through it, safely.

A ``.pth`` file is a pickle, and unpickling can run any code its author put in it. It is read with
``torch.load(..., weights_only=True)``, which only rebuilds tensors and plain containers; a file that needs
more is refused with the reason (convert it where its origin is trusted, e.g. to ``.safetensors``).
Training checkpoints that wrap the state dict (``{"state_dict": ...}``, ``{"model": ...}``) are unwrapped.
"""
from __future__ import annotations

import json
import pickle
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Union

import numpy as np

from trainkit.bridge.torch_import import import_torch
from trainkit.data.input_file import open_input
from trainkit.errors import CheckpointError

SAFETENSORS_SUFFIX = ".safetensors"
# Entries of a training checkpoint that commonly hold the model's state dict, tried in this order.
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network")


@dataclass
class StateDict:
    """Tensors read from a file: float arrays in their own precision widened to float32 where NumPy lacks it."""

    path: Path
    tensors: Dict[str, np.ndarray]
    source_dtypes: Dict[str, str]  # name -> the dtype in the file (e.g. bfloat16, which NumPy has not)
    entry: Optional[str] = None  # the wrapper entry the tensors came from
    ignored: List[str] = field(default_factory=list)  # top-level entries that are not tensors (epoch, optimizer...)


def read_state_dict(path: Union[str, Path], key: Optional[str] = None) -> StateDict:
    """Read the tensors of a PyTorch weights file.

    Args:
        path: ``.safetensors`` (read with safetensors' NumPy API) or a ``torch.save`` file (``.pth``, ``.pt``,
            ``.bin``, Lightning's ``.ckpt``; needs the ``torch`` extra).
        key: the entry of a wrapping dict that holds the state dict; None looks for one of `WRAPPER_KEYS`
            when the file's top level is not itself a state dict.

    Raises:
        CheckpointError: the file is missing, corrupt, needs arbitrary unpickling, or holds no tensors;
            the message names the file and what to do.
    """
    path = Path(path)
    with open_input(path, CheckpointError) as stream:  # a regular file only: a FIFO would hang the read
        if path.suffix == SAFETENSORS_SUFFIX:
            tensors, dtypes = _read_safetensors(path, stream.read())
            loaded: Mapping[str, Any] = tensors
        else:
            loaded, dtypes = _read_torch(path, stream), {}
    return _unwrap(path, loaded, dtypes, key)


def _read_safetensors(path: Path, data: bytes):
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        return load(data), {}
    except (TypeError, KeyError):  # a dtype NumPy does not have (bfloat16): read the raw bytes
        pass
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} cannot be read: it is corrupt or not a safetensors file: "
                              f"{_first_line(error)}") from error
    return _read_safetensors_raw(path, data)


def _read_safetensors_raw(path: Path, data: bytes):
    """The safetensors layout (8-byte little-endian header length, JSON header, raw data), bfloat16 widened."""
    numpy_dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    tensors, dtypes = {}, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = body[start:end]
        if info["dtype"] == "BF16":  # bfloat16 is the upper half of a float32
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            tensors[name] = bits.view(np.float32).reshape(info["shape"])
            dtypes[name] = "bfloat16"
        elif info["dtype"] in numpy_dtypes:
            tensors[name] = np.frombuffer(raw, dtype=numpy_dtypes[info["dtype"]]).reshape(info["shape"]).copy()
        else:
            raise CheckpointError(f"{path}: tensor {name} has dtype {info['dtype']}, which cannot be converted")
    return tensors, dtypes


def _read_torch(path: Path, stream: BinaryIO) -> Any:
    try:
        torch = import_torch()
    except ImportError as error:
        raise CheckpointError(f"{path}: reading a PyTorch file needs PyTorch: pip install 'trainkit[torch]', or save "
                              "the state dict as .safetensors (safetensors.torch.save_file), which needs no PyTorch "
                              "here") from error
    try:
        return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        needed = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if needed is None:
            raise CheckpointError(f"{path} cannot be read: it is corrupt or not a PyTorch file: "
                                  f"{_weights_only_reason(error)}") from error
        raise CheckpointError(
            f"{path} is refused: it holds more than tensors and plain containers (it needs {needed.group(1)}), and "
            "loading it would unpickle arbitrary objects -- a pickle can run any code its author put in it. Where "
            "you trust the file, save its state dict alone: torch.save(torch.load(PATH, weights_only=False)"
            "['state_dict'], 'weights.pth'), or as .safetensors") from error
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, KeyError) as error:
        raise CheckpointError(f"{path} cannot be read: it is corrupt or not a PyTorch file: "
                              f"{_first_line(error)}") from error


def _unwrap(path: Path, loaded: Any, dtypes: Dict[str, str], key: Optional[str]) -> StateDict:
    if not isinstance(loaded, Mapping):
        raise CheckpointError(f"{path} holds a {type(loaded).__name__}, not a state dict (a dict of tensors): save "
                              "model.state_dict(), not the model")
    entry, top_level = None, loaded
    if key is not None:
        if key not in loaded:
            raise CheckpointError(f"{path} has no entry {key!r} (--key); its entries: {_names(loaded)}")
        entry, loaded = key, loaded[key]
        if not isinstance(loaded, Mapping):
            raise CheckpointError(f"{path}: entry {key!r} is a {type(loaded).__name__}, not a state dict")
    elif not _tensor_names(loaded):
        found = [k for k in WRAPPER_KEYS if isinstance(loaded.get(k), Mapping) and _tensor_names(loaded[k])]
        if not found:
            raise CheckpointError(f"{path} holds no tensors at its top level nor in any of {', '.join(WRAPPER_KEYS)}: "
                                  f"its entries are {_names(loaded)}; name the one that holds the state dict "
                                  "with --key")
        entry, loaded = found[0], loaded[found[0]]
    names = _tensor_names(loaded)
    if not names:
        raise CheckpointError(f"{path}{f' entry {entry!r}' if entry else ''} holds no tensors")
    tensors, source_dtypes = {}, dict(dtypes)
    for name in names:
        tensors[name], dtype = _to_numpy(loaded[name])
        if dtype is not None:
            source_dtypes[name] = dtype
    for name, array in tensors.items():
        source_dtypes.setdefault(name, str(array.dtype))
    ignored = [str(k) for k in (top_level if entry else loaded) if k != entry and k not in tensors]
    return StateDict(path, tensors, source_dtypes, entry, ignored)


def _tensor_names(mapping: Mapping) -> List[str]:
    return [str(k) for k, v in mapping.items() if _is_tensor(v)]


def _is_tensor(value: Any) -> bool:
    return isinstance(value, np.ndarray) or type(value).__module__.startswith("torch") and hasattr(value, "numpy")


def _to_numpy(value: Any):
    """(array, dtype in the file when NumPy cannot hold it, else None)."""
    if isinstance(value, np.ndarray):
        return value, None
    dtype = str(value.dtype).replace("torch.", "")
    if dtype == "bfloat16":
        return value.float().numpy(), dtype
    return value.detach().cpu().numpy(), None


def _names(mapping: Mapping, shown: int = 8) -> str:
    keys = [str(k) for k in mapping]
    return ", ".join(keys[:shown]) + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def _weights_only_reason(error: BaseException) -> str:
    """The useful line of torch's weights-only message (the rest is advice about trusting the file)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if line.startswith("Unsupported") or "WeightsUnpickler error:" in line]
    return " ".join(useful) if useful else _first_line(error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
