"""Row 11, end to end: the whole `python -m trainkit` process against a plain PyTorch eager script of the same job.

Each side is a new process, timed from the parent (interpreter start-up to exit), the sides taking turns over
the repetitions. trainkit runs under `bench.wall_breakdown` (the command's own main with timers around its
phases, which also reports the time to the first step from the process's start); the PyTorch side is
a peer script per job: `bench.peer_quickstart_torch` for the quick start, `bench.peer_wine_torch` for
`wine_mlp`, `bench.peer_lstm_torch` for `digits_lstm`, `bench.peer_resnet_torch` for ResNet-50 at 32x32 on
generated CIFAR-10 files (9 steps; full bench only) -- see their docstrings for what "the same job" covers.
trainkit runs twice per repetition: with an empty compile cache (a first run) and with the cache its earlier run
filled (a sweep's next job of the same config, `trainkit/app/compile_cache.py`).
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from bench.common import Row, Settings, setup

REPO = Path(__file__).resolve().parents[1]


def _run(argv: List[str], cwd: Path, env: Dict[str, str]) -> Tuple[float, float, str]:
    """(wall seconds, seconds to the first step as the process reports it, its output)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {output[-2000:]}")
    found = re.search(r"first step at ([0-9.]+) s", output)
    if found is None:
        raise RuntimeError(f"{' '.join(argv)} did not report its first step: {output[-2000:]}")
    return wall, float(found.group(1)), output


#: name -> (trainkit's overrides, the peer module, its arguments, model described, batch, image side, (epochs in the
#: smoke run, 0: not run there; epochs in the full bench)), the overrides and arguments for (epochs, data root)
JOBS = {
    "quick start": (lambda epochs, data: [f"trainer.epochs={epochs}"], "bench.peer_quickstart_torch",
                    lambda epochs, data: [f"--epochs={epochs}"], "small_cnn (digits_quickstart)", 32, 8, (1, 5)),
    "wine_mlp": (lambda epochs, data: ["recipe=wine_mlp", f"trainer.epochs={epochs}"], "bench.peer_wine_torch",
                 lambda epochs, data: [f"--epochs={epochs}"], "mlp 13-32-3 (wine_mlp)", 16, "-", (0, 20)),
    "digits_lstm": (lambda epochs, data: ["recipe=digits_lstm", f"trainer.epochs={epochs}"], "bench.peer_lstm_torch",
                    lambda epochs, data: [f"--epochs={epochs}"], "row_lstm 8x8-64 (digits_lstm)", 32, 8, (0, 10)),
    "resnet50": (lambda epochs, data: ["recipe=resnet50_cifar10", "data.image_size=32", f"data.root={data}",
                                       "data.num_parallel_workers=1", f"trainer.epochs={epochs}"],
                 "bench.peer_resnet_torch", lambda epochs, data: [f"--epochs={epochs}", f"--root={data}"],
                 "resnet50 at 32x32, 9 steps an epoch (resnet50_cifar10)", 32, 32, (0, 1)),
}


RESNET_RECORDS = 64  # per training file (5) and in the test file: 288 training records after validation, 9 steps


def write_cifar10(root: Path, per_file: int = RESNET_RECORDS, seed: int = 0) -> None:
    """Random CIFAR-10 binary files in the official format (1 label byte, 3072 pixel bytes a record)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = rng.permutation(np.arange(per_file) % 10).astype(np.uint8)[:, None]
        pixels = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
        (folder / name).write_bytes(np.concatenate([labels, pixels], axis=1).tobytes())


def job(settings: Settings, name: str) -> List[Row]:
    overrides, peer, peer_args, model, batch, image, (smoke_epochs, epochs) = JOBS[name]
    epochs = smoke_epochs if settings.smoke else epochs
    reps = min(settings.reps, 2) if name == "resnet50" else settings.reps  # a minute a run
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    env.pop("TRAINKIT_COMPILE_CACHE", None)
    results: Dict[str, List[Tuple[float, float]]] = {"trainkit": [], "cached": [], "torch": []}
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-e2e-") as folder:
        base = Path(folder)
        runs = iter(range(10 ** 6))

        data = base / "cifar10"
        if name == "resnet50":
            write_cifar10(data)

        def trainkit(cache: Path) -> Tuple[float, float]:
            wall, first, _ = _run(["-m", "bench.wall_breakdown", *overrides(epochs, data),
                                   f"hydra.run.dir={base / f'run{next(runs)}'}"], base,
                                  {**env, "TRAINKIT_CACHE_DIR": str(cache)})
            return wall, first

        def torch_side() -> Tuple[float, float]:
            wall, first, _ = _run(["-m", peer, *peer_args(epochs, data), f"--out={base / f'peer{next(runs)}'}"], base,
                                  env)
            return wall, first

        warm = base / "warm-cache"
        trainkit(warm)  # fills the cache the "cached" side reads; uncounted
        for rep in range(reps):
            cold = base / f"cold{rep}"
            if (warm / "kernels").is_dir():  # a first run of a config, on a machine that built the kernels once
                shutil.copytree(warm / "kernels", cold / "kernels")
            sides = [("trainkit", lambda cold=cold: trainkit(cold)), ("cached", lambda: trainkit(warm)),
                     ("torch", torch_side)]
            for side, call in (sides if rep % 2 == 0 else sides[::-1]):
                results[side].append(call())

    def pairs(a: str, b: str, index: int, subtract: bool = False):
        values = [x[index] - y[index] if subtract else x[index] / y[index] for x, y in zip(results[a], results[b])]
        return statistics.median(values), f"{min(values):.3f}-{max(values):.3f} over {len(values)} pairs"

    def median(side: str, index: int) -> float:
        return statistics.median(r[index] for r in results[side])

    times = (f"whole process: trainkit {median('trainkit', 0):.2f} s, its second run {median('cached', 0):.2f} s, "
             f"PyTorch {median('torch', 0):.2f} s; first step at {median('trainkit', 1):.2f} / "
             f"{median('cached', 1):.2f} / {median('torch', 1):.2f} s; load average at the end "
             f"{os.getloadavg()[0]:.2f}")
    where = setup(model, batch, image, epochs=epochs, sides="a process each",
                  torch_threads=os.environ.get("OMP_NUM_THREADS", "default"))
    whole, whole_spread = pairs("trainkit", "torch", 0)
    cached, cached_spread = pairs("cached", "torch", 0)
    first, first_spread = pairs("trainkit", "torch", 1, subtract=True)
    again, again_spread = pairs("cached", "trainkit", 0)
    return [
        Row("11", f"end to end, {name}: whole process, trainkit / PyTorch eager", whole, "x", "<= 1.0",
            whole <= 1.0, whole_spread, times, where),
        Row("11", f"end to end, {name}: a second run of the config (compile cache) / PyTorch eager", cached, "x",
            "<= 1.0", cached <= 1.0, cached_spread, times, where),
        Row("11", f"end to end, {name}: time to the first step, trainkit - PyTorch eager", first, "s", "<= 1.0",
            first <= 1.0, first_spread, times, where),
        Row("11", f"end to end, {name}: second run / first run of the same config", again, "x", "< 1.0",
            again < 1.0, again_spread, times, where),
    ]


def run(settings: Settings) -> List[Row]:
    try:
        import torch  # noqa: F401
    except ImportError:
        where = setup("small_cnn (digits_quickstart)", 32, 8)
        return [Row("11", "end to end, quick start against PyTorch eager", None, "x",
                    details="PyTorch is not installed: pip install -e '.[bench]'", setup=where)]
    return [row for name in JOBS if JOBS[name][-1][1 if not settings.smoke else 0] > 0
            for row in job(settings, name)]  # the smoke (the test suite's) runs the quick start only
