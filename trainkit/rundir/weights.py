"""A network's weights as files: read them from any trainkit checkpoint, load them strictly, write them atomically.

Export, convert, compare, evaluate and fine-tuning (``model.pretrained``) all take "the weights of a network" from
one of three kinds of MindSpore checkpoint, told apart by their entries:

- a training checkpoint (``checkpoints/trainkit-<epoch>_<step>.ckpt``, ``best.ckpt``): the TrainingWrapper's
  state; the network's entries are picked out by :func:`network_parameter_names`, with the live
  values or the EMA shadows (``ema.<name>``);
- an exported checkpoint (``python -m trainkit.export``) or a converted one (``python -m trainkit.convert``):
  the network's parameters alone.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import logging
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Union

import mindspore as ms
import numpy as np
from mindspore import nn

from trainkit.errors import CheckpointError
from trainkit.rundir.checkpoint_file import APPENDED, load_checkpoint_file
from trainkit.rundir.output_file import written_whole
from trainkit.rundir.parameter_fit import fit_problems

log = logging.getLogger("trainkit")

WEIGHTS = ("live", "ema")
PYTORCH_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
EMA_PREFIX = "ema."
# What trainkit appends to a training checkpoint or best.ckpt besides Parameters.
_APPENDED = APPENDED + ("best_metric", "best_value", "best_step")


# Training state the TrainingWrapper adds under a prefix of its own or as a bare name.
_WRAPPER_PREFIXES = (EMA_PREFIX, "_grad_sum.", "_window_start.", "loss_scale.")


def network_parameter_names(names: Sequence[str]) -> List[str]:
    """The names in a TrainingWrapper checkpoint that are the network's own parameters.

    A network's parameters are named ``<cell>.<parameter>``. Everything else is training state:
    the wrapper's prefixed entries (``ema.``, ``_grad_sum.``, ``_window_start.``, ``loss_scale.``),
    bare names (``global_step``, ``learning_rate``, ``beta1_power``, ``momentum``, ``micro_step``,
    ``ema_num_updates``, ...), and an optimizer's per-parameter state, which MindSpore's optimizers
    clone from the weights as ``<prefix>.<weight name>`` (``moment1.``, ``moments.``, ``adam_m.``, ...):
    a prefix all of whose entries name another entry of the file. A bare name with an ``ema.`` shadow
    is a parameter of the network's root cell.
    """
    present = set(names)
    by_prefix: Dict[str, List[str]] = {}
    for name in names:
        if "." in name and not name.startswith(_WRAPPER_PREFIXES):
            by_prefix.setdefault(name.split(".", 1)[0], []).append(name)
    cloned = {prefix for prefix, group in by_prefix.items()
              if all(name.split(".", 1)[1] in present for name in group)}
    return [name for name in names
            if (name in present and EMA_PREFIX + name in present and "." not in name)
            or ("." in name and not name.startswith(_WRAPPER_PREFIXES) and name.split(".", 1)[0] not in cloned)]


@functools.lru_cache(maxsize=None)
def numpy_dtype(dtype) -> np.dtype:
    """NumPy's dtype for a MindSpore one, without ``mindspore.dtype_to_nptype`` (deprecated since 2.7: it logs a
    warning at every call, one per parameter)."""
    return ms.Tensor(0, dtype).asnumpy().dtype


def refuse_existing(output: Union[str, Path], force: bool) -> None:
    """Raise CheckpointError when `output` exists and `force` is False, or when no file can be written there
    whatever `force` says (a folder of that name, a file where a parent folder should be) -- before any work
    is done: the write would end in a traceback after it."""
    path = Path(output)
    if path.is_dir():
        raise CheckpointError(f"{output} is a folder: nothing was written; give a file name (--force replaces a file "
                              "only, never a folder)")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise CheckpointError(f"{output} cannot be written: {blocking} is a file, not a folder; nothing was written")
    if path.exists() and not force:
        raise CheckpointError(f"{output} already exists: nothing was written; choose another output or pass --force "
                              "to replace it")


def write_checkpoint(entries: Sequence[Dict], output: Union[str, Path]) -> Path:
    """``mindspore.save_checkpoint(entries)`` to a temporary file beside `output`, renamed into place, with its
    CRC32 (checked when trainkit reads it).

    The output is never left half-written: a crash or an error leaves the previous file (or none).
    """
    target = Path(output)
    with written_whole(target, ".ckpt") as temporary:  # save_checkpoint insists on .ckpt
        try:
            ms.save_checkpoint(list(entries), str(temporary), crc_check=True)
        finally:  # MindSpore's own temporary file, left where its save failed
            with contextlib.suppress(OSError):
                temporary.with_suffix(".tmp").unlink(missing_ok=True)
    return target


def is_training_checkpoint(saved: Dict) -> bool:
    """Whether a loaded checkpoint is a TrainingWrapper's (optimizer state, appended position) or a bare network's."""
    return "micro_steps" in saved or "global_step" in saved


def network_weights(path: Union[str, Path], weights: str = "live") -> Dict[str, np.ndarray]:
    """The network's parameters in `path`: a training, exported or converted MindSpore checkpoint.

    Args:
        path: the checkpoint file.
        weights: ``live`` or ``ema`` (a training checkpoint's EMA shadows; parameters without one keep the live
            value, as in :func:`trainkit.tools.export.export_checkpoint`).

    Raises:
        CheckpointError: the file is missing or corrupt, holds no network parameters, or has no EMA for ``ema``.
        ValueError: `weights` is not ``live`` or ``ema``.
    """

    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}; got {weights!r}")
    path = Path(path)
    if path.suffix in PYTORCH_SUFFIXES and path.is_file():
        raise CheckpointError(f"{path} is a PyTorch file, not a MindSpore checkpoint: convert it first (python -m "
                              f"trainkit.convert {path} {path.with_suffix('.ckpt').name} OVERRIDES...), or port "
                              "its model with python -m trainkit.port")
    saved = load_checkpoint_file(path)
    for key in _APPENDED:
        saved.pop(key, None)
    names = network_parameter_names(list(saved)) if is_training_checkpoint(saved) else list(saved)
    if not names:
        raise CheckpointError(f"{path} holds no network parameters (entries: {', '.join(list(saved)[:8])}, ...)")
    if weights == "ema":
        if not any(EMA_PREFIX + name in saved for name in names):
            raise CheckpointError(f"{path} holds no EMA weights (no ema.* entries): only a training checkpoint of a "
                                  "run with wrapper.ema_decay has them; use the live weights")
        return {name: saved.get(EMA_PREFIX + name, saved[name]).asnumpy() for name in names}
    return {name: saved[name].asnumpy() for name in names}


def matching(names: Iterable[str], patterns: Sequence[str]) -> List[str]:
    """The names matched by any shell-style pattern (``fc.*``, ``layer1.*``, ``*.bias``)."""
    return [name for name in names if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)]


def load_weights(network: nn.Cell, values: Dict[str, np.ndarray], source: str, keep_initialised: Sequence[str] = (),
                 option: str = "") -> List[str]:
    """Set every Parameter of `network` from `values`, strictly; returns the names that kept their initialisation.

    Args:
        network: the network, freshly built (its initialisation is what `keep_initialised` names keep).
        values: name -> array, e.g. from :func:`network_weights`.
        source: how to name `values` in messages (the file).
        keep_initialised: shell-style patterns of parameters that may be missing from `values` or shaped
            differently (a classification head for another number of classes): those keep the network's own
            initialisation. Those present with the right shape are loaded like any other.
        option: the option that sets `keep_initialised`, for the message (e.g. ``--allow-missing``).

    Raises:
        CheckpointError: parameters are missing, unknown or shaped differently (outside `keep_initialised`);
            nothing is loaded then.
    """
    own = {p.name: p for p in network.get_parameters()}
    problems = fit_problems(own, values, source, "the network",
                            excused=lambda name: bool(matching([name], keep_initialised)))
    if problems:
        hint = (f"; to start a head of another shape from the network's own initialisation, name it in {option} "
                "(e.g. ['fc.*'])" if option else "")
        raise CheckpointError(f"{source} does not fit the network ({'; '.join(problems)}){hint}")
    reinitialised = []
    for name, parameter in own.items():
        value = values.get(name)
        if value is None or tuple(value.shape) != tuple(parameter.shape):
            reinitialised.append(name)
            continue
        parameter.set_data(ms.Tensor(value.astype(numpy_dtype(parameter.dtype))))
    return reinitialised

