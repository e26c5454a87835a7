"""Errors raised for bad user input, before anything is compiled."""
from __future__ import annotations


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
