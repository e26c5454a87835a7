"""Errors raised for bad user input, before anything is compiled."""
from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Iterator, Optional, Union


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and what is valid."""


class DataError(ValueError):
    """Training data is missing or corrupt; the message names the path and how to fix it."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (caught as a ConfigError or as a TypeError)."""


class CheckpointError(DataError):
    """A checkpoint file is missing, corrupt or does not hold what was asked for; the message names the file."""


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many consecutive non-finite steps); the message names the step."""


class RunInterrupted(Exception):
    """A signal (SIGTERM, SIGINT) stopped the run after a step, with a checkpoint there; `status` is 128 + signal."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = int(signal_number)

    @property
    def status(self) -> int:
        return 128 + self.signal_number


class RunDirectoryInUse(ConfigError):
    """The run directory holds another run: it is refused without a byte written there (not even to its train.log)."""


def disk_full(error: BaseException) -> bool:
    """Whether `error` is a write that found the disk (or the user's quota) full."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def naming_the_file(path: Optional[Union[str, Path]]) -> Iterator[None]:
    """An OSError of a write to `path` that names no file (a flush's or a close's on a full disk) names `path`, so
    that the command's one line for it says which file (``trainkit/__main__.py``)."""
    try:
        yield
    except OSError as error:
        if error.filename is None and path is not None:
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise
