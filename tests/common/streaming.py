"""A data module that streams its rows through a GeneratorDataset (nothing to scan in prepare()), with one bad value
planted at a chosen training row: trainkit checks such a module batch by batch during the first epoch."""
import mindspore.dataset as ds
import numpy as np

FEATURES, ROWS = 5, 64


class StreamingRows:
    in_features, out_features = FEATURES, 3

    def __init__(self, batch_size: int = 8, bad_row: int = -1, bad: str = "feature", says_classes: bool = True,
                 **wine_keys):
        self.batch_size, self.bad_row, self.bad = batch_size, bad_row, bad  # the wine group's other keys: unused
        if says_classes:  # else the module has no num_classes at all: only the model's output width bounds labels
            self.num_classes = 3

    def prepare(self) -> None:
        pass

    def _rows(self, plant: bool):
        rng = np.random.default_rng(0)
        for row in range(ROWS):
            features = rng.normal(size=FEATURES).astype(np.float32)
            label = np.int32(row % 3)
            if plant and row == self.bad_row:
                if self.bad == "feature":
                    features[2] = np.nan
                else:
                    label = np.int32(int(self.bad))
            yield features, label

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0):
        return ds.GeneratorDataset(lambda: self._rows(True), ["features", "target"], shuffle=False).batch(
            self.batch_size, drop_remainder=True)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0):
        return ds.GeneratorDataset(lambda: self._rows(False), ["features", "target"], shuffle=False).batch(
            self.batch_size)
