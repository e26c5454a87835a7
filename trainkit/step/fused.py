"""Fused C++ kernels for the wrapper's per-step passes, through ``ops.Custom(func_type="aot")`` on CPU.

MindSpore 2.10's CPU kernels that write into a Parameter run at about a fifth of PyTorch's in-place foreach
(docs/performance.md, row 10): the EMA's ``assign_sub(e, (e - w) * c)`` is three kernels and three passes over
memory. An AOT kernel receives the Parameter's own memory and may write it in place (measured: the write is
visible to the graph, to ``asnumpy`` and to checkpoints), so the update is one multithreaded pass.

The kernels are compiled on first use with the system's C++ compiler (``$CXX``, else ``g++``) into
``<cache>/kernels/fused-<hash of the source and compiler>.so`` (``TRAINKIT_CACHE_DIR``, else
``$XDG_CACHE_HOME/trainkit``, else ``~/.cache/trainkit``), never into the package. Without a compiler, on a
device other than CPU, where the build fails, or with ``TRAINKIT_FUSED_KERNELS=0``, trainkit uses MindSpore's
kernels as before; :func:`describe` says which. Both paths compute ``e - (e - w) * c`` in float32 with the
same roundings (the kernel is built with ``-ffp-contract=off``: no fused multiply-add), so they agree bit for bit.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Tuple

log = logging.getLogger("trainkit")
ENTRY_POINTS = ("TrainkitEmaUpdate", "TrainkitAddInto")  # what the library must export

SOURCE = r"""
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace {
int64_t count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// Runs work(begin, end) over [0, n) in up to 8 threads; one thread below 256 Ki elements (a thread costs more).
template <typename Work>
void parallel(int64_t n, Work work) {
  unsigned threads = n < (int64_t(1) << 18) ? 1u : std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) {
    int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin < end) pool.emplace_back(work, begin, end);
  }
  work(int64_t(0), std::min(n, chunk));
  for (auto &thread : pool) thread.join();
}
}  // namespace

// shadow (float32, written in place), value (float32, same shape), weight (float32 scalar) -> flag (float32 [1]).
// shadow = shadow - (shadow - value) * weight: MindSpore's Sub, Mul and AssignSub in one pass.
extern "C" int TrainkitEmaUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam != 4) return 1;
  float *shadow = static_cast<float *>(params[0]);
  const float *value = static_cast<const float *>(params[1]);
  const float weight = *static_cast<const float *>(params[2]);
  parallel(count(ndims[0], shapes[0]), [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float difference = shadow[i] - value[i];
      float step = difference * weight;
      shadow[i] = shadow[i] - step;
    }
  });
  *static_cast<float *>(params[3]) = 0.0f;
  return 0;
}

// buffer (float32, written in place), value (float32, same shape) -> flag (float32 [1]).
// buffer = buffer + value: MindSpore's AssignAdd, multithreaded.
extern "C" int TrainkitAddInto(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam != 3) return 1;
  float *buffer = static_cast<float *>(params[0]);
  const float *value = static_cast<const float *>(params[1]);
  parallel(count(ndims[0], shapes[0]), [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buffer[i] = buffer[i] + value[i];
  });
  *static_cast<float *>(params[2]) = 0.0f;
  return 0;
}
"""

FLAGS = ["-O3", "-ffp-contract=off", "-shared", "-fPIC", "-pthread", "-std=c++14"]


def cache_dir() -> Path:
    """trainkit's cache folder: ``TRAINKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainkit``, else ~/.cache/trainkit."""
    if os.environ.get("TRAINKIT_CACHE_DIR"):
        return Path(os.environ["TRAINKIT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainkit"


def _off() -> bool:
    return os.environ.get("TRAINKIT_FUSED_KERNELS", "1").strip().lower() in ("0", "false", "off", "no")


@functools.lru_cache(maxsize=None)
def _build(compiler: str) -> Tuple[Optional[str], str]:
    """(the library's path or None, why not)."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
        digest = hashlib.sha256("\n".join([SOURCE, version, *FLAGS]).encode()).hexdigest()[:16]
        folder = cache_dir() / "kernels"
        library = folder / f"fused-{digest}.so"
        if library.is_file():
            if _loads(library):
                return str(library), ""
            log.warning("the cached kernels %s do not load (a damaged or foreign file): building them again", library)
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            source = Path(work) / "fused.cc"
            source.write_text(SOURCE)
            built = Path(work) / library.name
            done = subprocess.run([compiler, *FLAGS, "-o", str(built), str(source)], capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0:
                return None, f"{compiler} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
            if not _loads(built):
                return None, f"{compiler} built {library.name}, but it does not load"
            os.replace(built, library)  # atomic: a concurrent run sees no half-written library
        return str(library), ""
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"could not build the kernels: {error}"


def _loads(path: Path) -> bool:
    """Whether `path` is a library this process can load that has the kernels' entry points."""
    try:
        handle = ctypes.CDLL(str(path))
        return all(hasattr(handle, name) for name in ENTRY_POINTS)
    except OSError:
        return False


def library() -> Tuple[Optional[str], str]:
    """The compiled kernels' path, or (None, the reason MindSpore's own kernels run instead)."""
    if _off():
        return None, "TRAINKIT_FUSED_KERNELS=0"
    import mindspore as ms

    if ms.get_context("device_target") != "CPU":
        return None, f"the kernels are for CPU, the device is {ms.get_context('device_target')}"
    compiler = shutil.which(os.environ.get("CXX") or "g++")
    if compiler is None:
        return None, f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) on PATH"
    return _build(compiler)


def ema_update_kernel():
    """``ops.Custom`` updating an EMA shadow in place (inputs: shadow, value, weight), or None (see :func:`library`)."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitEmaUpdate")


def add_into_kernel():
    """``ops.Custom`` adding its second input into its first in place (inputs: buffer, value), or None."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitAddInto")


@functools.lru_cache(maxsize=None)
def _in_place_kernel(path: str, entry_point: str):
    """The library's `entry_point` as a primitive that writes its first input (its output is a dummy flag)."""
    from mindspore import dtype as mstype
    from mindspore import ops

    kernel = ops.Custom(f"{path}:{entry_point}", out_shape=lambda *shapes: [1],
                        out_dtype=lambda *dtypes: mstype.float32, func_type="aot")
    # It writes its first input: a memory side effect, which MindSpore's graph keeps and orders like an Assign's
    # (without the mark, a graph that does not use the kernel's output drops the kernel).
    kernel.add_prim_attr("side_effect_mem", True)
    return kernel


def describe() -> str:
    """Which path the wrapper's fused passes take, for a run's start-up lines."""
    path, reason = library()
    return f"fused C++ kernels ({path})" if path else f"MindSpore's kernels ({reason})"
