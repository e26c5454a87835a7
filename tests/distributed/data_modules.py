"""CIFAR-10 data modules that observe or break a data-parallel run, for tests/test_launch.py."""
import os
import time

from mindspore.communication import get_rank

from trainkit.data.cifar10 import Cifar10Data


class CrashOnRank(Cifar10Data):
    """Cifar10Data whose ``train_dataset`` raises on rank `crash_rank` after writing every rank's pid into
    `pid_dir` (so the test can check that no worker outlives the job)."""

    def __init__(self, crash_rank: int, pid_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.crash_rank = crash_rank
        self.pid_dir = pid_dir

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0):
        rank = get_rank()
        with open(os.path.join(self.pid_dir, f"rank_{rank}.pid"), "w") as pid_file:
            pid_file.write(str(os.getpid()))
        if rank == self.crash_rank:
            raise RuntimeError(f"planted failure on rank {rank}")
        return super().train_dataset(num_shards, shard_id)


class PreparedByRankZeroFirst(Cifar10Data):
    """Cifar10Data whose ``prepare`` stands for a download: rank 0's takes a while and leaves a marker file in
    `root`; on any other rank it fails unless rank 0's has finished."""

    MARKER = "prepared_by_rank_0"

    def prepare(self) -> None:
        marker = os.path.join(self.root, self.MARKER)
        if get_rank() == 0:
            time.sleep(2.0)
            with open(marker, "w") as marker_file:
                marker_file.write("done")
        elif not os.path.exists(marker):
            raise RuntimeError(f"rank {get_rank()} prepared the data before rank 0 finished")
        super().prepare()
