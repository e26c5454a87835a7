"""What ``port`` writes for a non-persistent buffer (``register_buffer(..., persistent=False)``): timm's Swin
relative position index and shifted-window attention mask, computed in the module's ``__init__`` and absent from
its ``state_dict``.

Its values are saved beside the generated module in ``buffers.npz`` (dtype kept: an index stays integer) and the
ported Cell holds each as a Tensor attribute read from there, not as a Parameter: as in PyTorch, it is right as
soon as the Cell is built (with or without ``model.pretrained``), it takes no gradient and no optimizer state, and
no checkpoint holds it, so a checkpoint's keys stay the ``state_dict``'s and ``export --to torch`` loads strictly.
Buffers of equal values (every block's index of one window size) are saved once, under the first one's path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from trainkit.bridge.port.layers import Call

BUFFERS_FILE = "buffers.npz"

HELPER = "buffer"
HELPERS: Dict[str, str] = {HELPER: f'''
def buffer(name):
    """PyTorch's non-persistent buffer `name` (computed in its __init__, absent from its state_dict), as port saved
    it in {BUFFERS_FILE} beside this file: a constant of the Cell, not a Parameter (no gradient, in no checkpoint)."""
    with np.load(Path(__file__).with_name("{BUFFERS_FILE}")) as buffers:
        return ms.Tensor(buffers[name])
'''}
HELPER_IMPORTS = {HELPER: ("numpy", "Path", "ms")}


def non_persistent(module: Any) -> List[Tuple[str, Any]]:
    """(name, tensor) of `module`'s own buffers that its ``state_dict`` leaves out."""
    own = list(module.named_buffers(recurse=False))
    saved = set(module.state_dict(keep_vars=True)) if own else set()
    return [(name, value) for name, value in own if name not in saved]


class Buffers:
    """The values of a model's non-persistent buffers, each kept once under the path of its first holder."""

    def __init__(self) -> None:
        self.values: Dict[str, np.ndarray] = {}
        self._keys: Dict[Tuple[str, Tuple[int, ...], bytes], str] = {}

    def call(self, path: str, value: Any) -> Call:
        """The code reading the buffer at `path` (``layers.0.blocks.0.attn.relative_position_index``)."""
        array = value.detach().cpu().numpy()
        identity = (str(array.dtype), array.shape, array.tobytes())
        key = self._keys.setdefault(identity, path)
        self.values.setdefault(key, array)
        return Call(HELPER, {"name": key}, helper=HELPER)  # differing between instances: an argument *_name

    def same(self, other: "Buffers") -> bool:
        """Whether `other` (the model rebuilt with an argument changed) holds the same values under the same names:
        else that argument moves what buffers.npz fixes, and cannot be an argument of the ported Cell."""
        return self.values.keys() == other.values.keys() and all(
            self.values[key].dtype == other.values[key].dtype and np.array_equal(self.values[key], other.values[key])
            for key in self.values)

    def save(self, folder: Path) -> None:
        """Write ``buffers.npz`` into `folder` (nothing when the model has no non-persistent buffer)."""
        if self.values:
            with open(folder / BUFFERS_FILE, "wb") as file:  # np.savez would add .npz to a name without it
                np.savez(file, **self.values)
