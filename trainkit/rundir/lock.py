"""One run per directory: an exclusive ``fcntl.flock`` on the run directory itself for the run's whole life.

Two runs in one directory (a scheduler's retry racing the original job, a double submit, two
``trainer.resume=auto`` at once) would interleave their records and checkpoints. The run that holds the lock
runs; any other is refused with :class:`~trainkit.errors.RunDirectoryInUse` naming the holder (pid, host, start),
before it writes anything.

* The lock is taken on the run directory's own descriptor, so no file in the directory can defeat it: deleting or
  replacing ``.trainkit.lock`` (which only names the holder) lets no second run in. The name file is locked too,
  for file systems that forward ``flock`` between machines (NFS does, as ``fcntl`` locks, for files only).
* ``.trainkit.lock`` is opened without following symbolic links and must be a regular file: a symbolic link
  (dangling or not), a directory or a FIFO of that name is refused with one line, and nothing is written through it.
* The kernel releases a ``flock`` when its process ends, however it ends, so a lock cannot outlive its run: a
  directory whose run was killed (SIGKILL, a crash, a lost machine's process) is free. The file is removed when a
  run ends normally (if it is still the file the run wrote), so one still there names a run that ended without
  releasing it; the run that takes the lock then says so in its log (:meth:`RunDirectoryLock.commit`).
* Until :meth:`RunDirectoryLock.commit` (every check passed, the run starts writing), a release puts the
  directory back as it was: the lock file removed if this run created it, its previous content restored if not.
  A refused or failed run therefore leaves the directory byte for byte as it found it.
* In data parallel the launcher (``python -m trainkit parallel.workers=N``) holds the lock for the whole job and
  tells its workers through :data:`HELD_BY`; without the launcher (``msrun`` started by hand), rank 0 holds it.
* ``flock`` is advisory: it keeps trainkit runs apart, not other programs. Across machines it holds only where the
  file system forwards it (NFS does, for the name file; a machine that deletes the name file on a shared file
  system is not seen by the others), and two machines writing one directory on a file system that ignores
  ``flock`` are not kept apart.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
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
        job: a name of the multi-machine job this lock is held for, written into the name file: the launchers of
            the job's other machines may then share a run directory on a shared file system (:func:`held_for_job`).
    """

    def __init__(self, run_dir: Path, job: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.job = job
        self.path = self.run_dir / LOCK_NAME
        self._directory: Optional[int] = None  # the run directory's descriptor, flocked
        self._descriptor: Optional[int] = None  # the name file's, flocked
        self._created = False
        self._previous = b""
        self._committed = False

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> None:
        """Take the lock, or raise RunDirectoryInUse naming the process that holds it (nothing is written then)."""
        if self._descriptor is not None:
            return
        directory = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(directory, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._in_use(_holder_named_in(self.path)) from None
            descriptor, created = self._open_name_file()
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held on another machine (NFS)
            except BlockingIOError:
                holder = _read(descriptor)
                os.close(descriptor)
                raise self._in_use(holder) from None
        except BaseException:
            os.close(directory)
            raise
        self._directory, self._descriptor, self._created = directory, descriptor, created
        self._previous = _read(descriptor)
        holder = {**_this_process(), **({"job": self.job} if self.job else {})}
        _write(descriptor, json.dumps(holder).encode() + b"\n")

    def _open_name_file(self) -> "tuple[int, bool]":
        """The name file's descriptor (and whether it was created), never through a link; refuse anything that
        is not a regular file."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
        for _ in range(100):  # another program removing and creating the file at once: give up after a while
            try:
                return os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                pass
            try:
                descriptor = os.open(self.path, flags)
            except FileNotFoundError:  # removed just now: create it
                continue
            except OSError as error:  # ELOOP: a symbolic link; EISDIR: a directory
                raise self._not_a_file(error) from None
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                os.close(descriptor)
                raise self._not_a_file(None)
            return descriptor, False
        raise RunDirectoryInUse(f"{self.path} keeps being removed and created by another program: nothing was "
                                "changed there")

    def _in_use(self, holder: bytes) -> RunDirectoryInUse:
        return RunDirectoryInUse(
            f"{self.run_dir} is in use by another run ({_describe(holder)}): nothing was changed there; wait for it "
            "to end, or choose another directory with hydra.run.dir=PATH (run_dir=PATH in-process)")

    def _not_a_file(self, error: Optional[OSError]) -> RunDirectoryInUse:
        kind = ("a symbolic link" if self.path.is_symlink() else "a directory" if self.path.is_dir()
                else f"not a regular file ({error.strerror})" if error is not None else "not a regular file")
        return RunDirectoryInUse(f"{self.path} is {kind}: trainkit writes its lock file nowhere else and through no "
                                 "link; nothing was changed there. Remove it, or choose another directory with "
                                 "hydra.run.dir=PATH")

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
        directory, self._directory = self._directory, None
        try:
            if self._committed or self._created:
                if _same_file(descriptor, self.path):  # a file put there by someone else stays
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
            else:
                _write(descriptor, self._previous)
        finally:
            os.close(descriptor)
            os.close(directory)  # releases the lock

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


def held_for_job(run_dir: Path, job: str) -> bool:
    """Whether `run_dir`'s lock is held right now, for the multi-machine job named `job` (by its machine 0's launcher:
    a peer of the same job on a shared file system, which may share the directory)."""
    try:
        directory = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(directory, fcntl.LOCK_SH | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        content = _holder_named_in(Path(run_dir) / LOCK_NAME)
        if free:  # no run holds the directory itself: ask the name file (held on another machine through NFS)
            free = _name_file_free(Path(run_dir) / LOCK_NAME)
    finally:
        os.close(directory)  # releases the shared lock, if taken
    try:
        holder = json.loads(content or b"{}")
    except ValueError:
        return False
    return not free and isinstance(holder, dict) and holder.get("job") == job


def _name_file_free(path: Path) -> bool:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def launcher_marker() -> Dict[str, str]:
    """The environment a launcher holding the lock gives its workers."""
    return {HELD_BY: f"{os.getpid()}@{socket.gethostname()}"}


def _this_process() -> Dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())}


def _holder_named_in(path: Path) -> bytes:
    """What the name file says of the holder ("" when it cannot be read as a plain file)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        return _read(descriptor)[:4096] if stat.S_ISREG(os.fstat(descriptor).st_mode) else b""
    finally:
        os.close(descriptor)


def _describe(content: bytes) -> str:
    try:
        holder = json.loads(content)
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet, or whose .trainkit.lock was removed"


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
        opened, named = os.fstat(descriptor), os.lstat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
