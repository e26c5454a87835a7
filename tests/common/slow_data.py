"""A CIFAR-10 data module whose training batches come at most every `batch_seconds`, so a test can signal a run
while it trains (tiny models take milliseconds per step). The values are CIFAR-10's: a run trains as it would."""
import time

import mindspore.dataset as ds

from trainkit.data.cifar10 import Cifar10Data


class SlowCifar10(Cifar10Data):
    def __init__(self, batch_seconds: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.batch_seconds = batch_seconds

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0):
        pause = self.batch_seconds
        ds.config.set_prefetch_size(1)  # else the pipeline runs ahead during compilation and the steps are not paced

        def slowly(label):
            time.sleep(pause)
            return label

        return super().train_dataset(num_shards, shard_id).map(operations=slowly, input_columns=["label"],
                                                               num_parallel_workers=1)  # one batch at a time
