"""A network whose construction puts the run's metrics file on a full disk (Linux's /dev/full: every write that
reaches it fails with ENOSPC), for the command's one line on a full disk."""
import builtins

import trainkit.callbacks.run_log as run_log
from trainkit.models.small_cnn import SmallCNN


def _open(path, *args, **kwargs):
    if str(path).endswith("metrics.jsonl"):
        return builtins.open("/dev/full", *args, **kwargs)
    return builtins.open(path, *args, **kwargs)


class MetricsOnAFullDisk(SmallCNN):
    """The quick start's network; built (before the app opens its records), it sends metrics.jsonl to /dev/full."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        run_log.open = _open  # RunLog opens the file by this module's name `open`
