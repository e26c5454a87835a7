"""What a user's own project plugs in through `_target_`: a model, a data module and a TrainingWrapper subclass."""
from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype

from trainkit import TrainingWrapper

FEATURES = 4


class UserMLP(nn.Cell):
    def __init__(self, num_classes: int = 3, hidden: int = 16):
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(FEATURES, hidden), nn.ReLU(), nn.Dense(hidden, num_classes))

    def construct(self, x):
        return self.body(x)


class BlobData:
    """Three well separated Gaussian blobs: the data-module protocol the app uses, in a dozen lines."""

    num_classes = 3

    def __init__(self, batch_size: int = 16, samples: int = 96):
        rng = np.random.RandomState(0)
        centers = np.eye(3, FEATURES, dtype=np.float32) * 6
        labels = np.arange(samples) % 3
        self.arrays = (centers[labels] + rng.randn(samples, FEATURES).astype(np.float32), labels.astype(np.int32))
        self.batch_size = batch_size

    def prepare(self) -> None:
        pass

    def _dataset(self, shuffle: bool, num_shards: int, shard_id: int) -> ds.Dataset:
        images, labels = self.arrays
        data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=shuffle, num_shards=num_shards,
                                     shard_id=shard_id)
        return data.batch(self.batch_size, drop_remainder=shuffle)

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset(True, num_shards, shard_id)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset(False, num_shards, shard_id)


class CountingWrapper(TrainingWrapper):
    """A subclass overriding one phase: counts the updates it applies."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.applied_updates = Parameter(Tensor(0, mstype.int32), name="applied_updates", requires_grad=False)

    def apply_grads(self, grads):
        applied = super().apply_grads(grads)
        return ops.depend(ops.assign_add(self.applied_updates, ops.ones((), mstype.int32)), applied)
