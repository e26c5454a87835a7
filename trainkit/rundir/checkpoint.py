"""Training checkpoints: the file (:mod:`trainkit.rundir.checkpoint_file`) and, for the names it held before
0.2, the resume policy (:mod:`trainkit.app.resume_policy`).

Every name this module had still works: the file's names are its own again here; ``check_resumable``,
``restore``, ``RESUME_KEYS``, ``DATA_KEYS_FREE`` and ``SCHEDULE_KEYS`` come from the app's resume policy with a
DeprecationWarning, and so does ``TrainingCheckpoint`` (now ``SavedCheckpoint``, apart from the callback
``trainkit.callbacks.training_checkpoint.PeriodicCheckpoint``). The deprecated names are removed in 0.3.0.
"""
from __future__ import annotations

import importlib
import warnings

from trainkit.rundir.checkpoint_file import *  # noqa: F401,F403
from trainkit.rundir.checkpoint_file import (  # noqa: F401 (the private names other modules read)
    _CRC_MARK,
    _fails_its_crc,
    _scalar,
    _stored_config,
)

_MOVED_TO_POLICY = ("check_resumable", "restore", "RESUME_KEYS", "DATA_KEYS_FREE", "SCHEDULE_KEYS")


def __getattr__(name: str):
    if name == "TrainingCheckpoint":
        warnings.warn("trainkit.rundir.checkpoint.TrainingCheckpoint is now "
                      "trainkit.rundir.checkpoint_file.SavedCheckpoint; the old name is removed in 0.3.0",
                      DeprecationWarning, stacklevel=2)
        from trainkit.rundir.checkpoint_file import SavedCheckpoint

        return SavedCheckpoint
    if name in _MOVED_TO_POLICY:
        warnings.warn(f"trainkit.rundir.checkpoint.{name} is now trainkit.app.resume_policy.{name}; the old name is "
                      "removed in 0.3.0", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("trainkit.app.resume_policy"), name)  # the app's: never imported here
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
