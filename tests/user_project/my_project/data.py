"""A regression data module with its own column names: y = x . w + 3 + noise, four features."""
import mindspore.dataset as ds
import numpy as np

WEIGHTS = np.array([1.5, -2.0, 0.5, 1.0], np.float32)


class LinearData:
    """`in_features`/`out_features` fill the model's keys left null; columns "x" (input) and "y" (target)."""

    out_features = 1

    def __init__(self, batch_size: int = 16, samples: int = 128, noise: float = 0.1, float_labels: bool = True):
        rng = np.random.RandomState(0)
        x = rng.randn(samples, len(WEIGHTS)).astype(np.float32)
        y = (x @ WEIGHTS + 3.0 + noise * rng.randn(samples)).astype(np.float32).reshape(-1, 1)
        split = samples * 3 // 4
        self.train_arrays, self.eval_arrays = (x[:split], y[:split]), (x[split:], y[split:])
        self.in_features = x.shape[1]
        self.batch_size = batch_size

    def prepare(self) -> None:
        pass

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        x, y = self.train_arrays
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=num_shards, shard_id=shard_id)
        return data.batch(self.batch_size, drop_remainder=True)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        x, y = self.eval_arrays
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(self.batch_size)
