"""One run per directory: an exclusive ``fcntl.flock`` on ``<run_dir>/.trainkit.lock`` for the run's whole life.

Two runs in one directory (a scheduler's retry racing the original job, a double submit, two
``trainer.resume=auto`` at once) would interleave their records and checkpoints. The run that holds the lock
runs; any other is refused with :class:`~trainkit.errors.RunDirectoryInUse` naming the holder (pid, host, start),
before it writes anything.

* The kernel releases a ``flock`` when its process ends, however it ends, so a lock cannot outlive its run: a
  directory whose run was killed (SIGKILL, a crash, a lost machine's process) is free. The file is removed when a
  run ends normally, so one still there names a run that ended without releasing it; the run that takes the lock
  then says so in its log (:meth:`RunDirectoryLock.commit`).
* Until :meth:`RunDirectoryLock.commit` (every check passed, the run starts writing), a release puts the
  directory back as it was: the lock file removed if this run created it, its previous content restored if not.
  A refused or failed run therefore leaves the directory byte for byte as it found it.
* In data parallel the launcher (``python -m trainkit parallel.workers=N``) holds the lock for the whole job and
  tells its workers through :data:`HELD_BY`; without the launcher (``msrun`` started by hand), rank 0 holds it.
* ``flock`` is advisory and local to one kernel unless the file system forwards it (NFS does, as ``fcntl``
  locks; some network file systems do not): two machines writing one directory on a file system that ignores
  ``flock`` are not kept apart.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional

from trainkit.errors import RunDirectoryInUse

log = logging.getLogger("trainkit")

LOCK_NAME = ".trainkit.lock"
HELD_BY = "TRAINKIT_RUN_DIR_LOCK_HOLDER"  # "<pid>@<host>" of the launcher holding the lock for its workers


class RunDirectoryLock:
    """The exclusive lock of one run directory (a context manager: leaving it releases the lock).

    Args:
        run_dir: the run directory (it must exist).
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._descriptor: Optional[int] = None
        self._created = False
        self._previous = b""
        self._committed = False

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> None:
        """Take the lock, or raise RunDirectoryInUse naming the process that holds it (nothing is written then)."""
        while self._descriptor is None:
            try:
                descriptor, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                try:
                    descriptor, created = os.open(self.path, os.O_RDWR), False
                except FileNotFoundError:  # its holder removed it just now: try again
                    continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read(descriptor))
                os.close(descriptor)
                raise RunDirectoryInUse(
                    f"{self.run_dir} is in use by another run ({holder}): nothing was changed there; wait for it to "
                    "end, or choose another directory with hydra.run.dir=PATH (run_dir=PATH in-process)") from None
            if not _same_file(descriptor, self.path):  # locked a file its holder removed while releasing: again
                os.close(descriptor)
                continue
            self._descriptor, self._created = descriptor, created
        self._previous = _read(self._descriptor)
        _write(self._descriptor, json.dumps(_this_process()).encode() + b"\n")

    def commit(self) -> None:
        """The run starts writing: from now on the lock file stays its own until the end; say whether it took
        over the lock of a run that ended without releasing it."""
        if self._descriptor is None or self._committed:
            return
        self._committed = True
        if self._previous.strip():
            log.warning("%s: took over the lock of a run that ended without releasing it (%s)", self.run_dir,
                        _describe(self._previous))

    def release(self) -> None:
        """Release the lock; before :meth:`commit`, the directory is left as :meth:`acquire` found it."""
        if self._descriptor is None:
            return
        descriptor, self._descriptor = self._descriptor, None
        try:
            if self._committed or self._created:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # still locked: a process that opened it retries (see acquire)
            else:
                _write(descriptor, self._previous)
        finally:
            os.close(descriptor)  # releases the flock

    def __enter__(self) -> RunDirectoryLock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def held_by_launcher(run_dir: Path) -> bool:
    """Whether the launcher that started this worker holds `run_dir`'s lock for the job (see :data:`HELD_BY`)."""
    launcher = os.environ.get(HELD_BY)
    if not launcher:
        return False
    try:
        holder = json.loads((Path(run_dir) / LOCK_NAME).read_bytes() or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(holder, dict) and f"{holder.get('pid')}@{holder.get('host')}" == launcher


def launcher_marker() -> Dict[str, str]:
    """The environment a launcher holding the lock gives its workers."""
    return {HELD_BY: f"{os.getpid()}@{socket.gethostname()}"}


def _this_process() -> Dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())}


def _describe(content: bytes) -> str:
    try:
        holder = json.loads(content)
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def _read(descriptor: int) -> bytes:
    os.lseek(descriptor, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(descriptor, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _write(descriptor: int, content: bytes) -> None:
    os.ftruncate(descriptor, 0)
    os.lseek(descriptor, 0, os.SEEK_SET)
    os.write(descriptor, content)


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        opened, named = os.fstat(descriptor), os.stat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
