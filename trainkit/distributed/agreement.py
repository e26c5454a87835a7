"""Before the first step (and after a resume) every rank must start from the same place: the same step, the same
weights and optimizer state, the same decisive config. One all-gather of a small vector checks it.

Without it, ranks that resumed from different checkpoints (machines with a run directory each, one of which had
no checkpoint) pair their all-reduces anyway and average gradients of different weights: a silent mix. With it,
every rank stops with the same one line naming the first rank that differs from rank 0 and what differs, before
anything is written.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from trainkit.errors import ConfigError

# The config groups (or keys) that decide the arithmetic of a step. What may differ between machines is left out:
# file locations, worker threads, downloads, logging, node_rank/master_addr, trainer.resume (auto on one machine, a
# path on another is fine when both find the same step and weights, which are checked themselves).
DECISIVE: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("model", ()),
    ("data", ("root", "download", "url", "md5", "num_parallel_workers")),
    ("loss", ()),
    ("optimizer", ()),
    ("lr_schedule", ()),
    ("amp", ()),
    ("wrapper", ()),
    ("trainer", ("resume", "device_target", "save_checkpoints", "keep_checkpoints", "checkpoint_every_n_steps",
                 "profile", "test", "evaluate", "eval_interval", "best_metric", "best_mode", "early_stopping")),
    ("parallel", ("node_rank", "master_addr", "master_port")),
)
_CHUNK_BITS = 16  # a 64-bit value travels as four 16-bit chunks in float32 (exact below 2**24)
_CHUNKS = 4


class RanksDisagree(ConfigError):
    """Ranks would start from different steps, weights or configs; every rank raises it with the same message."""


def start_signature(step: int, parameters: Sequence[Tuple[str, np.ndarray]], cfg: Mapping[str, Any]) -> Dict[str, int]:
    """What this rank must share with every other before training: name -> a 64-bit value.

    Args:
        step: the micro-batches done (0 for a new run, the checkpoint's position after a resume).
        parameters: (name, value) of every parameter of the training cell (weights, optimizer state, EMA...).
        cfg: the run's config, as plain data (any mapping: nested mappings and sequences are read as such).
    """
    digest = hashlib.blake2b(digest_size=8)
    for name, value in sorted(parameters, key=lambda item: item[0]):
        array = np.ascontiguousarray(value)
        digest.update(name.encode())
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(array.tobytes())
    signature = {"step": int(step), "weights and optimizer state": int.from_bytes(digest.digest(), "little")}
    for group, left_out in DECISIVE:
        plain = _plain(cfg.get(group))
        if isinstance(plain, dict):
            plain = {key: value for key, value in plain.items() if key not in left_out}
        text = json.dumps(plain, sort_keys=True, default=str).encode()
        signature[f"config {group}"] = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    return signature


def encode(signature: Dict[str, int]) -> np.ndarray:
    """The signature's values as float32 chunks, exact in any all-gather."""
    chunks = []
    for value in signature.values():
        chunks.extend((value >> (_CHUNK_BITS * i)) & ((1 << _CHUNK_BITS) - 1) for i in range(_CHUNKS))
    return np.asarray(chunks, dtype=np.float32)


def decode(vector: np.ndarray, names: Sequence[str]) -> Dict[str, int]:
    values = [int(round(float(x))) for x in np.asarray(vector).reshape(-1)]
    return {name: sum(values[k * _CHUNKS + i] << (_CHUNK_BITS * i) for i in range(_CHUNKS))
            for k, name in enumerate(names)}


def disagreement(signatures: List[Dict[str, int]]) -> Optional[str]:
    """The one line that names the first rank differing from rank 0 and what differs; None when all agree."""
    reference = signatures[0]
    for rank, signature in enumerate(signatures[1:], start=1):
        differing = [name for name in reference if signature[name] != reference[name]]
        if not differing:
            continue
        what = []
        for name in differing:
            if name == "step":
                what.append(f"it starts from micro-batch {signature['step']}, rank 0 from {reference['step']}")
            else:
                what.append(f"its {name} differ{'s' if name.startswith('config') else ''} from rank 0's")
        others = sum(1 for later in signatures[rank + 1:] if later != reference)
        more = f" ({others} more rank(s) differ too)" if others else ""
        return (f"rank {rank} does not start where rank 0 does: {'; '.join(what)}{more}; nothing was written. Every "
                "machine must resume from the same checkpoint (one shared run directory, or a copy of rank 0's "
                "checkpoints/ in each machine's) with the same config")
    return None


def _plain(node: Any) -> Any:
    """`node` as dicts and lists (a config's mappings and sequences, whatever their class)."""
    if isinstance(node, Mapping):
        return {str(key): _plain(value) for key, value in node.items()}
    if isinstance(node, Sequence) and not isinstance(node, (str, bytes)):
        return [_plain(value) for value in node]
    return node


def check_ranks_agree(step: int, wrapper: Any, cfg: Mapping[str, Any], group_size: int) -> None:
    """All-gather this rank's start signature; raise :class:`RanksDisagree` on every rank if any rank differs.

    Call it on every rank after the checkpoint (if any) is restored and before anything is written.
    """
    if group_size < 2:
        return
    parameters = [(name, parameter.asnumpy()) for name, parameter in wrapper.parameters_and_names()]
    signature = start_signature(step, parameters, cfg)
    gathered = _all_gather(encode(signature)).reshape(group_size, -1)
    message = disagreement([decode(row, list(signature)) for row in gathered])
    if message is not None:
        raise RanksDisagree(message)


def _all_gather(vector: np.ndarray) -> np.ndarray:
    import mindspore as ms
    from mindspore import ops

    return ops.AllGather()(ms.Tensor(vector, ms.float32)).asnumpy()
