"""Log lines held back until the input is accepted, so a refused run leaves an earlier run's ``train.log`` as it was.

Hydra opens ``train.log`` in the run directory before trainkit sees the config, and a resume logs what it finds
(the checkpoint, the config keys that changed) before it can refuse. ``python -m trainkit`` therefore holds every
line meant for a log file from its start (:func:`hold`) until ``train`` has checked all its input
(:func:`release`); a refusal (:func:`drop`) then writes nothing into a log that held an earlier run's lines, and
writes the held lines and the error into a log that was new.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import List

from trainkit.errors import disk_full


class _Holding(logging.Handler):
    """Keeps the records meant for `target` (a FileHandler) until they are released or dropped."""

    def __init__(self, target: logging.FileHandler):
        super().__init__(logging.NOTSET)
        self.target = target
        self.records: List[logging.LogRecord] = []
        try:
            self.file_was_new = os.path.getsize(target.baseFilename) == 0
        except OSError:
            self.file_was_new = True

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _holding() -> List[_Holding]:
    return [h for h in logging.getLogger().handlers if isinstance(h, _Holding)]


def hold() -> None:
    """Hold the records of the root logger's file handlers (Hydra's ``train.log``) from now on."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            root.addHandler(_Holding(handler))


def _said_once_when_full(handler: logging.FileHandler) -> None:
    """`handler`'s write errors on a full disk: one line on stderr the first time, not logging's traceback for
    every line (the write that fails next, a record's or a checkpoint's, ends the run with its own line)."""
    original = handler.handleError
    said: List[bool] = []

    def handle_error(record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if error is None or not disk_full(error):
            original(record)
        elif not said:
            said.append(True)
            print(f"trainkit: warning: {handler.baseFilename} could not be written: the disk is full "
                  f"({error.strerror}); its lines are lost from here", file=sys.stderr, flush=True)

    handler.handleError = handle_error  # type: ignore[method-assign]


def release() -> None:
    """The input is accepted: write the held records and log into the files directly again (no-op unless held)."""
    root = logging.getLogger()
    for holding in _holding():
        root.removeHandler(holding)
        _said_once_when_full(holding.target)
        root.addHandler(holding.target)
        for record in holding.records:
            holding.target.handle(record)


def drop(error: BaseException) -> None:
    """The input is refused with `error`: a log file that held lines before this process keeps its bytes; a new one
    gets the held lines and the error. Once released (an error found while training, such as a bad batch), the
    error goes into the log files, which are this run's."""
    root = logging.getLogger()
    refusal = logging.getLogger("trainkit").makeRecord("trainkit", logging.ERROR, __file__, 0, "%s", (error,), None)
    if not _holding():
        for handler in root.handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(refusal)
        return
    for holding in _holding():
        root.removeHandler(holding)
        if holding.file_was_new:
            for record in holding.records:
                holding.target.handle(record)
            holding.target.handle(refusal)
        holding.target.close()


def discard() -> None:
    """Stop holding without writing anything: for processes that must not write the log (other ranks)."""
    root = logging.getLogger()
    for holding in _holding():
        root.removeHandler(holding)
        holding.target.close()


def log_files() -> List[str]:
    """The files the root logger writes (or holds lines for)."""
    root = logging.getLogger()
    return [h.baseFilename for h in root.handlers if isinstance(h, logging.FileHandler)] + [
        h.target.baseFilename for h in _holding()]
