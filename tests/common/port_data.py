"""Tiny random data modules for training ported models a few steps: images of any shape, or token ids."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import mindspore.dataset as ds
import numpy as np


class RandomSamples:
    """`samples` random inputs of `shape` (token ids in [0, vocab) when `vocab` is given) with random labels."""

    def __init__(self, shape: Sequence[int], num_classes: int, vocab: Optional[int] = None, samples: int = 8,
                 batch_size: int = 4):
        rng = np.random.default_rng(0)
        shape = (samples, *shape)
        inputs = rng.integers(0, vocab, shape).astype(np.int32) if vocab else rng.uniform(-1, 1, shape).astype(
            np.float32)
        self.arrays = (inputs, rng.integers(0, num_classes, samples).astype(np.int32))
        self.batch_size = batch_size

    def prepare(self) -> None:
        pass

    def _dataset(self, num_shards: int, shard_id: int) -> ds.Dataset:
        data = ds.NumpySlicesDataset({"input": self.arrays[0], "label": self.arrays[1]}, shuffle=False,
                                     num_shards=num_shards, shard_id=shard_id)
        return data.batch(self.batch_size, drop_remainder=True)

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset(num_shards, shard_id)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset(num_shards, shard_id)


class LateClasses:
    """A data module that learns its number of classes in prepare(), as one reading its labels from disk would."""

    def __init__(self, samples: int = 12, batch_size: int = 4):
        self.samples, self.batch_size = samples, batch_size
        self.num_classes: Optional[int] = None

    def prepare(self) -> None:
        self.num_classes = 3

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        rng = np.random.default_rng(0)
        data = ds.NumpySlicesDataset({"x": rng.normal(size=(self.samples, 4)).astype(np.float32),
                                      "y": rng.integers(0, 3, self.samples).astype(np.int32)}, shuffle=False)
        return data.batch(self.batch_size)

    train_dataset = eval_dataset


def train_ported(package: Path, model: str, run_dir: Path, *extra: str):
    """Train the ported `package` (its conf/ and weights.ckpt, the config group `model`) two epochs on the
    RandomSamples of its conf/data/random.yaml, a checkpoint every step, AdamW: the runs the resume tests compare."""
    from trainkit.app import train
    from trainkit.app.config import compose_config

    return train(compose_config([f"hydra.searchpath=[file://{package / 'conf'}]", f"model={model}",
                                 f"model.pretrained={package / 'weights.ckpt'}", "data=random", "trainer.epochs=2",
                                 "trainer.eval_interval=0", "trainer.checkpoint_every_n_steps=1",
                                 "trainer.keep_checkpoints=20", "logger.progress=off", "optimizer=adamw",
                                 "optimizer.lr=0.01", f"run_dir={run_dir}", *extra]))
