"""What every benchmark shares: settings, the side-by-side timer, the environment line and the result row."""
from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from typing import Callable, Dict, List, Optional

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn


@dataclasses.dataclass
class Settings:
    """How much to measure: `full()` is what `make bench` runs, `smoke()` only proves that every row runs."""

    reps: int          # alternating repetitions of each side
    warmup: int        # uncounted steps after the compiling first step
    small_steps: int   # steps per repetition for the small CNN
    large_steps: int   # steps per repetition for ResNet-50
    batch: int         # ResNet-50 / small-CNN batch
    image: int         # image size
    native_steps: int  # steps per repetition for ResNet-50 with MindSpore's own (slow on CPU) convolution
    app_epochs: int    # epochs of the digits run in row 4
    large_model: str = "resnet50"  # rows 1-3 and 5 (large_backbone); the smoke test's RGB small CNN compiles in 1 s
    feature_rows: bool = True  # rows 2': each wrapper feature alone (the smoke test skips their compiles)
    smoke: bool = False

    @classmethod
    def full(cls) -> "Settings":
        return cls(reps=5, warmup=2, small_steps=20, large_steps=2, batch=32, image=32, native_steps=1, app_epochs=12)

    @classmethod
    def smoke_test(cls) -> "Settings":
        return cls(reps=1, warmup=0, small_steps=1, large_steps=1, batch=4, image=8, native_steps=1, app_epochs=1,
                   large_model="small_cnn_rgb", feature_rows=False, smoke=True)


@dataclasses.dataclass
class Row:
    """One line of the table: a ratio of two sides (or a plain value), its bar and the conditions it ran under."""

    row: str
    name: str
    value: Optional[float]
    unit: str
    bar: str = ""
    passed: Optional[bool] = None
    spread: str = ""
    details: str = ""
    setup: Dict[str, object] = dataclasses.field(default_factory=dict)

    def status(self) -> str:
        if self.value is None:
            return "skipped"
        if self.passed is None:
            return "reported"
        return "met" if self.passed else "MISSED"


def environment() -> Dict[str, object]:
    """Machine, versions, threads and load: the conditions a table was measured under."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "mindspore": ms.__version__,
        "device_target": ms.get_context("device_target"),
        "cpu_count": os.cpu_count(),
        "threads": threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in load],
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def threads() -> int:
    """MindSpore's CPU kernel threads (runtime_num_threads; MindSpore uses every core when unset)."""
    return int(ms.get_context("runtime_num_threads") or os.cpu_count() or 1)


def setup(model: str, batch: int, image: int, **extra) -> Dict[str, object]:
    """The conditions of one row, printed next to it."""
    mode = "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative"
    return {"model": model, "batch": batch, "image": image, "mode": mode, "threads": threads(),
            "mindspore": ms.__version__, **extra}


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def alternate(sides: Dict[str, Callable[[], object]], reps: int) -> Dict[str, List[float]]:
    """Seconds of each call, the sides taking turns (A B, B A, A B, ...) so drifting load hits both alike."""
    names = list(sides)
    seconds: Dict[str, List[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            seconds[name].append(timed(sides[name]))
    return seconds


def alternate_blocks(blocks: Dict[str, Dict[str, Callable[[], object]]], reps: int) -> Dict[str, List[float]]:
    """`alternate` within each block (one framework's sides), the blocks taking turns too; each block starts with
    one untimed call of its first side, so the first timed side does not pay for waking that framework's threads
    after the other framework ran (PyTorch's OpenMP pool, MindSpore's actor threads)."""
    order = list(blocks)
    seconds: Dict[str, List[float]] = {name: [] for block in blocks.values() for name in block}
    for rep in range(reps):
        for block_name in (order if rep % 2 == 0 else order[::-1]):
            block = blocks[block_name]
            names = list(block)
            block[names[0]]()
            for name in (names if rep % 2 == 0 else names[::-1]):
                seconds[name].append(timed(block[name]))
    return seconds


def ratio(seconds: Dict[str, List[float]], numerator: str, denominator: str):
    """Median ratio of paired repetitions and its spread (min-max of the per-repetition ratios)."""
    pairs = [a / b for a, b in zip(seconds[numerator], seconds[denominator])]
    return statistics.median(pairs), f"{min(pairs):.3f}-{max(pairs):.3f} over {len(pairs)} pairs"


def median_ms(values: List[float], per: int = 1) -> str:
    return f"{statistics.median(values) / per * 1000:.1f} ms"


def batch_tensors(batch: int, channels: int, image: int, classes: int = 10, seed: int = 0):
    rng = np.random.RandomState(seed)
    images = Tensor(rng.randn(batch, channels, image, image).astype(np.float32))
    labels = Tensor((np.arange(batch) % classes).astype(np.int32))
    return images, labels


def large_backbone(settings: Settings, num_classes: int = 10) -> nn.Cell:
    """The RGB model of rows 1-3 and 5 (``settings.large_model``): ResNet-50 in the bench; the smoke test only
    proves the rows run, so it takes a small CNN on RGB images (ResNet-18's six compiles were 25 s of the suite)."""
    from trainkit.models import SmallCNN, resnet18, resnet50

    builders = {"resnet50": resnet50, "resnet18": resnet18,
                "small_cnn_rgb": lambda num_classes: SmallCNN(num_classes=num_classes, in_channels=3)}
    return builders[settings.large_model](num_classes=num_classes)


def loss_network(backbone: nn.Cell) -> nn.Cell:
    return nn.WithLossCell(backbone, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


class Stepper:
    """A training-step Cell fed one fixed batch: compile once (timed apart), warm up, then `run(steps)`."""

    def __init__(self, step_cell: nn.Cell, inputs, warmup: int):
        self.cell = step_cell
        self.cell.set_train()
        self.inputs = inputs
        self.compile_seconds = timed(self._step)  # graph mode compiles on the first call
        for _ in range(warmup):
            self._step()

    def _step(self):
        out = self.cell(*self.inputs)
        first = out[0] if isinstance(out, (tuple, list)) else out
        return first.asnumpy()  # waits for the step to finish

    def run(self, steps: int) -> Callable[[], None]:
        def call():
            for _ in range(steps):
                self._step()
        return call
