"""A CIFAR-10 data module whose training batches come at most every `batch_seconds`, so a test can signal a run
while it trains (tiny models take milliseconds per step). The values are CIFAR-10's: a run trains as it would."""
import time

from trainkit.data.cifar10 import Cifar10Data


class SlowCifar10(Cifar10Data):
    def __init__(self, batch_seconds: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.batch_seconds = batch_seconds

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0):
        pause = self.batch_seconds

        def slowly(label):
            time.sleep(pause)
            return label

        return super().train_dataset(num_shards, shard_id).map(operations=slowly, input_columns=["label"])
