"""Building and loading trainkit's fused CPU kernels (``fused.cc`` beside this file), once per machine.

The library is compiled on first use with the system's C++ compiler (``$CXX``, else ``g++``) into
``<cache>/kernels/fused-<hash of the source and compiler>.so`` (``TRAINKIT_CACHE_DIR``, else
``$XDG_CACHE_HOME/trainkit``, else ``~/.cache/trainkit``), never into the package. Without a compiler, on a
device other than CPU, where the build fails, or with ``TRAINKIT_FUSED_KERNELS=0``, :func:`library` says why and
trainkit runs MindSpore's own kernels instead; :func:`describe` words it for a run's start-up lines.

A library is code: loading one runs its constructors. So a cached library is loaded only when nobody else could
have put it there -- the file and every folder above it belong to this user (or root) and none is writable by
another user, except a folder with the sticky bit such as ``/tmp`` (:func:`unsafe_folder`); a shared cache folder
makes trainkit run MindSpore's kernels and say why -- and only when its SHA-256 is the one recorded beside it when
it was built (``fused-<hash>.so.sha256``): a damaged or foreign file is built again without ever being opened.
"""
from __future__ import annotations

import _ctypes
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Tuple

log = logging.getLogger("trainkit")
#: What the library must export (a cached library without one of them is built again).
ENTRY_POINTS = ("TrainkitEmaUpdate", "TrainkitAddInto", "TrainkitIm2Col", "TrainkitCol2Im", "TrainkitEmaUpdateAll",
                "TrainkitAddIntoAll", "TrainkitMomentumAll", "TrainkitAdamAll",
                "TrainkitAdamWeightDecayAll", "TrainkitEmaUpdateAllIf", "TrainkitRestoreAllUnless",
                "TrainkitAccumulateAll", "TrainkitNormAll", "TrainkitGelu", "TrainkitGeluGrad",
                "TrainkitDepthwise", "TrainkitDepthwiseGradInput", "TrainkitDepthwiseGradWeight",
                "TrainkitMaxPool", "TrainkitMaxPoolGrad", "TrainkitLayerNorm",
                "TrainkitLayerNormGrad", "TrainkitBatchNorm", "TrainkitBatchNormGrad", "TrainkitDigest")
SOURCE = (Path(__file__).with_name("fused.cc")).read_text()

FLAGS = ["-O3", "-ffp-contract=off", "-shared", "-fPIC", "-pthread", "-std=c++14"]


def cache_dir() -> Path:
    """trainkit's cache folder: ``TRAINKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainkit``, else ~/.cache/trainkit."""
    if os.environ.get("TRAINKIT_CACHE_DIR"):
        return Path(os.environ["TRAINKIT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainkit"


def _off() -> bool:
    return os.environ.get("TRAINKIT_FUSED_KERNELS", "1").strip().lower() in ("0", "false", "off", "no")


def unsafe_folder(path: Path) -> Optional[str]:
    """Why code read from `path` could have been written by another user (None when it could not).

    `path` and every folder above it must belong to this user or root; none may be writable by another user,
    except a folder above `path` with the sticky bit (``/tmp``: others may add entries, not replace ours).
    """
    uid = os.getuid()
    real = Path(os.path.realpath(path))
    for depth, item in enumerate([real, *real.parents]):
        try:
            info = os.stat(item)
        except OSError as error:
            return f"{item}: {error.strerror}"
        if info.st_uid not in (uid, 0):
            return f"{item} belongs to another user (uid {info.st_uid})"
        if info.st_mode & 0o022 and not (depth > 0 and info.st_mode & stat.S_ISVTX):
            return f"{item} is writable by other users (mode {info.st_mode & 0o7777:o})"
    return None


def _recorded(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hash_recorded(library: Path) -> bool:
    """Whether `library`'s SHA-256 is the one recorded beside it (whoever wrote it)."""
    try:
        return _recorded(library).read_text().strip() == _sha256(library)
    except OSError:
        return False


def _cached(library: Path, digest: str) -> bool:
    """Whether `library` is this build, checked without opening it as a library first (a foreign file's
    constructors would run), then loaded once to check its entry points."""
    try:
        if os.lstat(library).st_nlink != 1 or not stat.S_ISREG(os.lstat(library).st_mode):
            return False  # a link: not a file this build wrote
        if _recorded(library).read_text().strip() != _sha256(library):
            return False
    except OSError:
        return False
    return _loads(library, digest)


@functools.lru_cache(maxsize=None)
def _build(compiler: str) -> Tuple[Optional[str], str]:
    """(the library's path or None, why not)."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
        digest = hashlib.sha256("\n".join([SOURCE, version, *FLAGS]).encode()).hexdigest()[:16]
        folder = cache_dir() / "kernels"
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        unsafe = unsafe_folder(folder)
        if unsafe:
            return None, (f"{unsafe}: trainkit loads no library another user could have written (make the cache "
                          "private with chmod go-w, or set TRAINKIT_CACHE_DIR)")
        library = folder / f"fused-{digest}.so"
        if os.path.lexists(library):
            if _cached(library, digest):
                return str(library), ""
            if _hash_recorded(library):
                log.warning("the cached kernels %s carry their recorded SHA-256 but are not this build's (no entry "
                            "point or another build's digest: a file and hash written together by someone who can "
                            "write %s, or another trainkit): building them again", library, folder)
            elif not os.path.lexists(_recorded(library)):
                log.info("the cached kernels %s have no recorded SHA-256 (an older trainkit built them): building "
                         "them again, without loading that file", library)
            else:
                log.warning("the cached kernels %s are not the ones this build wrote (a damaged or foreign file): "
                            "building them again, without loading that file", library)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            source = Path(work) / "fused.cc"
            source.write_text(SOURCE)
            built = Path(work) / library.name
            done = subprocess.run([compiler, *FLAGS, f'-DTRAINKIT_DIGEST="{digest}"', "-o", str(built), str(source)],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                return None, f"{compiler} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
            if not _loads(built, digest):
                return None, f"{compiler} built {library.name}, but it does not load"
            recorded = Path(work) / _recorded(library).name
            recorded.write_text(_sha256(built) + "\n")
            os.replace(recorded, _recorded(library))
            os.replace(built, library)  # atomic: a concurrent run sees no half-written library
        return str(library), ""
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"could not build the kernels: {error}"


def _loads(path: Path, digest: str) -> bool:
    """Whether `path` is a library this process can load, with the kernels' entry points, built as `digest`.

    The library is closed again after the check: left open, a foreign file under the same name would be the one
    MindSpore's own dlopen of that path finds, even after it was rebuilt.
    """
    try:
        handle = ctypes.CDLL(str(path))
    except OSError:
        return False
    try:
        if not all(hasattr(handle, name) for name in ENTRY_POINTS):
            return False
        handle.TrainkitDigest.restype = ctypes.c_char_p
        return handle.TrainkitDigest() == digest.encode()
    finally:
        _ctypes.dlclose(handle._handle)


def library() -> Tuple[Optional[str], str]:
    """The compiled kernels' path, or (None, the reason MindSpore's own kernels run instead)."""
    if _off():
        return None, f"TRAINKIT_FUSED_KERNELS={os.environ['TRAINKIT_FUSED_KERNELS']}"
    import mindspore as ms

    if ms.get_context("device_target") != "CPU":
        return None, f"the kernels are for CPU, the device is {ms.get_context('device_target')}"
    compiler = shutil.which(os.environ.get("CXX") or "g++")
    if compiler is None:
        return None, f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) on PATH"
    return _build(compiler)


def describe() -> str:
    """Which path the wrapper's fused passes take, for a run's start-up lines."""
    path, reason = library()
    return f"fused C++ kernels ({path})" if path else f"MindSpore's kernels ({reason})"
