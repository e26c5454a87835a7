"""In-memory arrays as a pipeline of whole batches: one ``mindspore.dataset`` row a batch, not a row a sample.

MindSpore's pipeline costs about 40 µs a row on a CPU whatever the row holds (a lone index costs as much): a
``NumpySlicesDataset(...).batch(32)`` spends 1.0-1.5 ms a batch, a third of the quick start's step, where PyTorch's
loop over in-memory tensors spends a few µs. A ``GeneratorDataset`` whose rows are whole batches, cut from the arrays
with NumPy's fancy indexing, spends 0.1-0.2 ms (docs/performance.md, "The loop and the evaluations").

The order is MindSpore's where there is nothing to draw: shard k of an ordered set holds samples k, k + num_shards,
... wrapped around to equal sizes, as ``NumpySlicesDataset``'s distributed sampler gives them. A shuffled set draws
each pass's permutation from NumPy's generator seeded by (``mindspore.dataset.config.get_seed()``, the pass), the
same on every shard, so a run is reproducible and a resume that replays the pipeline to its step
(``trainer.resume_data=exact``) sees the same batches. A pass counts only when it is read to its end (a look at
the first batch, as ``output_shapes()`` takes, does not move the sequence on). MindSpore's fast recovery
(``trainer.resume_data=fast``) skips into an epoch without running the source's earlier passes, so there a shuffled
set is ``NumpySlicesDataset``'s, row by row.
"""
from __future__ import annotations

import math
from typing import Dict, Iterator, Tuple

import mindspore.dataset as ds
import numpy as np


class ArrayBatches:
    """The batches of `columns` (equal-length arrays) for ``GeneratorDataset``: an iterable, one tuple a batch.

    Args:
        columns: name -> array, the samples along the first axis.
        batch_size: samples a batch.
        shuffle: draw a new order every pass (else the arrays' order).
        drop_remainder: leave out a last batch smaller than `batch_size`.
        seed: the generator's seed (with the pass's number).
        num_shards, shard_id: this process's share of the samples (see the module's docstring).
    """

    def __init__(self, columns: Dict[str, np.ndarray], batch_size: int, *, shuffle: bool, drop_remainder: bool,
                 seed: int = 0, num_shards: int = 1, shard_id: int = 0):
        self.arrays = tuple(np.ascontiguousarray(array) for array in columns.values())
        self.samples = len(self.arrays[0])
        if any(len(array) != self.samples for array in self.arrays):
            raise ValueError(f"the columns {', '.join(columns)} differ in length: "
                             f"{', '.join(str(len(array)) for array in self.arrays)}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_remainder = bool(drop_remainder)
        self.seed = int(seed)
        # Positions in the pass's order this shard takes: k, k + num_shards, ... wrapped around.
        per_shard = math.ceil(self.samples / num_shards)
        self.positions = (np.arange(per_shard) * num_shards + shard_id) % max(self.samples, 1)
        self.passes = 0  # completed passes: the next pass's number

    def __len__(self) -> int:
        whole, rest = divmod(len(self.positions), self.batch_size)
        return whole + (1 if rest and not self.drop_remainder else 0)

    def order(self, number: int) -> np.ndarray:
        """The sample indices of pass `number`, this shard's, in the order they are batched."""
        if not self.shuffle:
            return self.positions
        return np.random.default_rng([self.seed, number]).permutation(self.samples)[self.positions]

    def __iter__(self) -> Iterator[Tuple[np.ndarray, ...]]:
        order = self.order(self.passes)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            chosen = order[start:start + self.batch_size]
            yield tuple(array[chosen] for array in self.arrays)
        self.passes += 1  # read to its end: the next pass draws anew


def array_batches(columns: Dict[str, np.ndarray], batch_size: int, *, shuffle: bool, drop_remainder: bool,
                  num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
    """A ``mindspore.dataset`` pipeline of `columns` in batches of `batch_size`, one row a batch (see the module)."""
    if shuffle and ds.config.get_fast_recovery():  # fast recovery skips passes the source never ran: MindSpore's own
        shards = {"num_shards": num_shards, "shard_id": shard_id} if num_shards > 1 else {}
        rows = ds.NumpySlicesDataset(columns, shuffle=True, **shards)
        return rows.batch(batch_size, drop_remainder=drop_remainder)
    source = ArrayBatches(columns, batch_size, shuffle=shuffle, drop_remainder=drop_remainder,
                          seed=ds.config.get_seed(), num_shards=num_shards, shard_id=shard_id)
    dataset = ds.GeneratorDataset(source, column_names=list(columns), shuffle=False, num_parallel_workers=1,
                                  python_multiprocessing=False)
    if shuffle:  # what the app records in checkpoints, so a resume into another order is said (DATA_ORDER)
        dataset.trainkit_data_order = SHUFFLED_ORDER
    return dataset


#: The checkpoint entry naming how the training set's order was drawn (absent: MindSpore's own sampler).
DATA_ORDER = "data_order"
#: Its value for a shuffled :func:`array_batches` set.
SHUFFLED_ORDER = "trainkit.data.array_batches: a permutation per epoch drawn by (seed, epoch)"
#: Its value for any other set (and what a checkpoint without the entry means).
SAMPLER_ORDER = "mindspore.dataset's sampler"


def order_of(dataset: ds.Dataset) -> str:
    """How `dataset`'s order is drawn, as checkpoints record it (:data:`DATA_ORDER`)."""
    return getattr(dataset, "trainkit_data_order", SAMPLER_ORDER)
