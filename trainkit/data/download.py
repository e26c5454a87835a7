"""Download an archive with MD5 verification and extract it without letting it write outside its folder.

Both steps are all-or-nothing: the download streams into a temporary file next to the destination and is renamed
into place only once its MD5 matches, and extraction goes into a temporary folder first, so an interrupted or
corrupt download never leaves files that look like a valid dataset.
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from typing import Callable, Optional, TextIO, Union

from trainkit.errors import DataError

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


def file_md5(path: str) -> str:
    """MD5 hex digest of a file, read in chunks so large archives need little memory."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Progress:
    """Progress lines on a stream: rewritten in place on a terminal, every 10% otherwise (readable in log files)."""

    def __init__(self, label: str, total: Optional[int], stream: Optional[TextIO]):
        self.label, self.total, self.stream = label, total, stream
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.last_step = -1
        self.last_time = 0.0

    def update(self, done: int, final: bool = False) -> None:
        if self.stream is None:
            return
        if final and not self.tty and self.last_step == (100 * done // self.total if self.total else done):
            return  # the last line already says it
        if self.total:
            step = 100 * done // self.total
            text = f"{self.label}: {step}% ({done / 1e6:.1f} / {self.total / 1e6:.1f} MB)"
            due = step // 10 > self.last_step // 10 if not self.tty else step > self.last_step
        else:
            step = done
            text = f"{self.label}: {done / 1e6:.1f} MB"
            due = time.monotonic() - self.last_time > (0.5 if self.tty else 10.0)
        if not (due or final):
            return
        self.last_step, self.last_time = step, time.monotonic()
        self.stream.write(("\r" + text + ("\n" if final else "")) if self.tty else text + "\n")
        self.stream.flush()


def download_file(url: str, dest: str, md5: Optional[str] = None, *, timeout: float = 60.0,
                  progress: Union[bool, TextIO] = True, fix_hint: str = "") -> str:
    """Download `url` to `dest` (streamed to a temporary file, renamed when complete and verified); return the MD5.

    Raises DataError naming the URL when the server cannot be reached or the transfer fails, and naming the
    expected and actual MD5 on a mismatch; in both cases nothing is left at `dest` or in its folder.
    `fix_hint` is appended to those messages (how to get the data another way). `progress`: True writes progress
    lines to stderr, False nothing, a stream writes them there.
    """
    stream = sys.stderr if progress is True else (progress or None)
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    hint = f" {fix_hint}" if fix_hint else ""
    fd, part = tempfile.mkstemp(prefix=os.path.basename(dest) + ".", suffix=".part", dir=folder)
    digest = hashlib.md5()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 - the URL is the user's setting
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
                reason = err if isinstance(err, urllib.error.HTTPError) else getattr(err, "reason", err)
                raise DataError(f"Could not download {url}: {reason}. Check the URL and the network (or proxy)."
                                f"{hint}") from err
            with response:
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                shown = _Progress(f"Downloading {url}", total, stream)
                logger.info("Downloading %s to %s", url, dest)
                done = 0
                try:
                    for chunk in iter(lambda: response.read(_CHUNK), b""):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        shown.update(done)
                except (OSError, http.client.HTTPException) as err:  # timeouts and connection resets are OSError
                    raise DataError(f"Download of {url} failed after {done} bytes: {err}. Try again; check the "
                                    f"network and the free space in {folder}.{hint}") from err
                shown.update(done, final=True)
                if total is not None and done != total:
                    raise DataError(f"Download of {url} is incomplete: got {done} of {total} bytes. Try again.{hint}")
        actual = digest.hexdigest()
        if md5 is not None and actual.lower() != md5.lower():
            raise DataError(f"MD5 mismatch for {url}: expected {md5.lower()}, got {actual} ({done} bytes). The "
                            f"download was deleted. The server may have returned an error page or a different file; "
                            f"check data.url and data.md5.{hint}")
        os.replace(part, dest)
        return actual
    finally:
        if os.path.exists(part):
            os.remove(part)


def _check_member(member: tarfile.TarInfo, archive: str) -> None:
    """Refuse members that could write outside the extraction folder or create anything but files and folders."""
    name = member.name
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
        raise DataError(f"Refusing to extract {archive}: member {name!r} points outside the extraction folder, "
                        f"so the archive is not the expected dataset.")
    if not (member.isfile() or member.isdir()):
        raise DataError(f"Refusing to extract {archive}: member {name!r} is a link or special file, which the "
                        f"dataset archive does not contain.")


def extract_tar(archive: str, dest: str, *, on_member: Optional[Callable[[str], None]] = None) -> None:
    """Extract a (compressed) tar archive into `dest` after checking every member is a plain file or folder inside.

    Members are checked before anything is written, so a malicious or damaged archive extracts nothing.
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, archive)
            for member in members:
                target = os.path.join(dest, *member.name.replace("\\", "/").split("/"))
                if member.isdir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # regular files always have content
                with source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
                if on_member is not None:
                    on_member(member.name)
    except (tarfile.TarError, EOFError, OSError) as err:
        detail = " ".join(str(err).split())  # tarfile's messages span several lines
        raise DataError(f"Could not extract {archive}: it is damaged or not a tar archive ({type(err).__name__}: "
                        f"{detail}).") from err
