"""A trained network ready to answer, as ``predict`` and ``export`` use it: the run's config, its data module
(prepared: the statistics its evaluation transforms need), and the checkpoint's weights in the network built for
inference, under the run's ``amp.level``, with float32 outputs.

The config comes as ``evaluate`` takes it (:func:`trainkit.tools.evaluate.evaluation_config`): a run directory's
saved config, a training checkpoint's own, else the overrides; a stored config names only trusted targets.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.common import dtype as mstype
from omegaconf import DictConfig, OmegaConf

from trainkit.app import build, run
from trainkit.app.tool_config import build_network
from trainkit.errors import ConfigError
from trainkit.rundir.data_state import load_data_state
from trainkit.rundir.weights import load_weights, network_weights
from trainkit.tools.evaluate import evaluation_config, find_checkpoint

_OVERRIDE = re.compile(r"^[+~]?[A-Za-z_][\w.]*=")


class InferenceCell(nn.Cell):
    """The backbone in evaluation mode with float32 outputs (an ``amp.level`` network gives float16 ones)."""

    def __init__(self, backbone: nn.Cell):
        super().__init__()
        self.backbone = backbone
        self.set_train(False)

    def construct(self, x):
        return self.backbone(x).astype(mstype.float32)


@dataclass
class Trained:
    """What :func:`load_trained` read: the config, the checkpoint, the prepared data module and the network."""

    cfg: DictConfig
    checkpoint: Path
    data: Any
    network: InferenceCell
    values: dict

    @property
    def num_classes(self) -> Optional[int]:
        """The classes the network tells apart, or None for a regression (no ``num_classes`` anywhere)."""
        found = (build.model_args_from_data(self.cfg.model, self.data).get("num_classes")
                 or self.cfg.model.get("num_classes") or getattr(self.data, "num_classes", None))
        return None if found is None else int(found)

    def rebuilt(self, **model_keys: Any) -> InferenceCell:
        """The same weights in the network built with other ``model`` keys (``conv_impl="native"``)."""
        cfg = OmegaConf.create(OmegaConf.to_container(self.cfg))
        for key, value in model_keys.items():
            OmegaConf.update(cfg, f"model.{key}", value, merge=False)
        return _inference_network(cfg, self.data, self.values, self.checkpoint)


def split_arguments(items: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(paths, overrides): ``key=value`` items that name no existing file are overrides of the config."""
    # os.path.exists, not Path.exists: a text run's sentence longer than a file name raises there (ENAMETOOLONG)
    overrides = [item for item in items if _OVERRIDE.match(item) and not os.path.exists(item)]
    return [item for item in items if item not in overrides], overrides


def load_trained(target: Path, overrides: Sequence[str] = (), weights: str = "live", which: str = "best",
                 trust: Sequence[str] = (), work_dir: Optional[Path] = None) -> Trained:
    """The checkpoint `target` names (a file, or a run directory's best or newest), its config, the data module
    prepared, and the network holding the checkpoint's `weights` (``live`` or ``ema``).

    Raises:
        CheckpointError, ConfigError, DataError: one line each, before anything compiles.
    """
    checkpoint = find_checkpoint(target, which)
    cfg = evaluation_config(target, checkpoint, overrides, trust)
    run.set_context(cfg.trainer, work_dir or checkpoint.parent)  # compiler dumps there, not in the cwd
    values = network_weights(checkpoint, weights)  # a bad file stops before the data is read
    data = build.instantiate_group("data", cfg.data)
    restore_data(data, checkpoint)
    return Trained(cfg, checkpoint, data, _inference_network(cfg, data, values, checkpoint), values)


def restore_data(data: Any, checkpoint: Path) -> None:
    """Make `data` ready to prepare inputs as the run did: from the state the run stored (the checkpoint's own,
    else its run directory's ``data_state.json``) where the module keeps one (a table's statistics, categories and
    classes), so a prediction reads no training file; else by ``prepare()``."""
    state = load_data_state(checkpoint) if callable(getattr(data, "load_state_dict", None)) else None
    if state is not None:
        data.load_state_dict(state)
    else:
        data.prepare()


def _inference_network(cfg: DictConfig, data: Any, values: dict, checkpoint: Path) -> InferenceCell:
    network = build_network(cfg, data)
    load_weights(network, values, str(checkpoint))
    with tempfile.TemporaryDirectory() as folder, run.inside(Path(folder)):  # amp=O1 writes its rewrite here
        backbone = build.build_loss_network_for(cfg, network, build.build_loss_fn(cfg)).backbone
    return InferenceCell(backbone)


def outputs(network: nn.Cell, batch: np.ndarray) -> np.ndarray:
    """The network's float32 outputs for a NumPy batch."""
    return network(ms.Tensor(np.ascontiguousarray(batch))).asnumpy()


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run the block in PyNative mode, then return to the mode set before.

    A graph-mode network compiles at its first call (about 0.5 s of CPU for the digits' small CNN, more than
    predicting every digit); run eagerly, one call costs a few operator launches and gives the same outputs. So a
    prediction's first batch runs eagerly, and the graph compiles only when a second batch comes."""
    mode = ms.get_context("mode")
    if mode == ms.PYNATIVE_MODE:
        yield
        return
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=mode)


def data_batch(data: Any, split: str = "val", limit: int = 16) -> np.ndarray:
    """The first `limit` inputs of the `split` set (``val``: ``eval_dataset()``, ``test``: ``test_dataset()``), as
    the network takes them: the first column of the data's batches, with its evaluation transforms."""
    if split == "test" and not callable(getattr(data, "test_dataset", None)):
        raise ConfigError(f"--split test: the data module {type(data).__name__} has no test_dataset(); use "
                          "--split val")
    dataset = data.test_dataset() if split == "test" else data.eval_dataset()
    rows: List[np.ndarray] = []
    for batch in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        rows.extend(batch[0][:limit - len(rows)])
        if len(rows) >= limit:
            break
    return np.stack(rows)
