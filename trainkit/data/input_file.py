"""Every input file trainkit reads is opened here: a regular file only, and no more bytes than its reader allows.

A FIFO named ``pipe.jpg`` in a class folder blocks whatever opens it until something writes to it (the run hangs,
deaf to SIGTERM, in a C++ reader); a character device (``/dev/zero``, or a link to it) never ends; a socket, a
folder named ``x.jpg`` or ``/dev/null`` holds no data. Each is refused in one line naming the path and what it is.

The path is ``stat``-ed first (a device is never opened: opening one may have effects), then opened with
``O_NONBLOCK`` -- so a FIFO put in its place between the ``stat`` and the ``open`` cannot block the open -- and the
open descriptor is ``fstat``-ed: what is read is what was checked. Symbolic links are followed (a link to a regular
file is that file). Readers that take a path and open it themselves (MindSpore's ``load_checkpoint`` and
``ImageFolderDataset``) get the path checked by :func:`check_input` just before; a swap after it is theirs to meet.

The helpers raise :class:`~trainkit.errors.DataError` (or the class a caller names, e.g. ``CheckpointError``).
"""
from __future__ import annotations

import contextlib
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Type, Union

from trainkit.errors import DataError

PathLike = Union[str, "os.PathLike[str]"]
# O_NONBLOCK: opening a FIFO for reading returns at once (no writer needed); it means nothing for a regular file.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_BINARY", 0)


def kind_of(mode: int) -> Optional[str]:
    """What a file of `mode` (``st_mode``) is, in words, when it is not a regular file; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return f"a file of another kind (mode {stat.S_IFMT(mode):#o})"


def _refusal(path: Path, name: str, mode: int) -> str:
    link = ""
    if path.is_symlink():
        with contextlib.suppress(OSError):
            link = f" (a link to {os.path.realpath(path)})"
    return f"{name}{link} is {kind_of(mode)}, not a regular file: trainkit reads inputs from regular files only"


def _unreadable(path: Path, name: str, error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        return f"{name} does not exist" + (f" (a link to {os.path.realpath(path)}, which does not)"
                                           if path.is_symlink() else "")
    reason = error.strerror or type(error).__name__
    return f"{name} cannot be read ({reason})"


def open_descriptor(path: PathLike, error: Type[Exception] = DataError, name: Optional[str] = None) -> int:
    """A read-only descriptor of `path`, which is a regular file (checked on the open descriptor), in blocking mode.

    Args:
        path: the input.
        error: the exception class raised (DataError, a subclass, or ConfigError for a file a setting names).
        name: how messages name the input (default: the path), e.g. ``checkpoint runs/a/best.ckpt``.

    Raises:
        `error`: one line naming the input: it does not exist, cannot be opened, or is not a regular file.
    """
    path = Path(path)
    name = str(path) if name is None else name
    try:
        mode = os.stat(path).st_mode  # follows links: a link to /dev/zero is a character device
    except OSError as problem:
        raise error(_unreadable(path, name, problem)) from problem
    if kind_of(mode) is not None:
        raise error(_refusal(path, name, mode))
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as problem:  # swapped for a socket since the stat (ENXIO), removed, or not readable
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = stat.S_IFREG
        raise error(_unreadable(path, name, problem) if kind_of(mode) is None else _refusal(path, name, mode)) \
            from problem
    try:
        mode = os.fstat(descriptor).st_mode
        if kind_of(mode) is not None:  # swapped between the stat and the open
            raise error(_refusal(path, name, mode))
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def check_input(path: PathLike, error: Type[Exception] = DataError, name: Optional[str] = None) -> os.stat_result:
    """Check that `path` is a regular file that opens for reading, for a reader that opens it itself; its stat.

    Raises `error` as :func:`open_descriptor` does."""
    descriptor = open_descriptor(path, error, name)
    try:
        return os.fstat(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def open_input(path: PathLike, error: Type[Exception] = DataError, name: Optional[str] = None) -> Iterator[BinaryIO]:
    """`path` opened for reading in binary (a buffered stream, seekable), refused unless it is a regular file.

    Raises `error` as :func:`open_descriptor` does."""
    with io.open(open_descriptor(path, error, name), "rb", closefd=True) as stream:
        yield stream


def read_input(path: PathLike, limit: Optional[int] = None, error: Type[Exception] = DataError,
               name: Optional[str] = None) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (None: no bound).

    Args:
        limit: a file longer than this is refused, after reading no more than ``limit + 1`` bytes.

    Raises:
        `error`: as :func:`open_descriptor`, or the file is longer than `limit`, naming the bound.
    """
    name = str(path) if name is None else name
    with open_input(path, error, name) as stream:
        data = stream.read() if limit is None else stream.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise error(f"{name} is longer than {limit:,} bytes, the most trainkit reads of it")
    return data
