"""Small image-folder data sets written with Pillow, for the image_folder data module's tests."""
from pathlib import Path
from typing import Dict, Sequence

import numpy as np
from PIL import Image


def write_image(path: Path, rng: np.random.Generator, size=(10, 12), mode: str = "RGB", fmt: str = None) -> Path:
    """A random image of `mode` at `path` (its format from the suffix unless `fmt`); class-dependent brightness is
    the caller's business."""
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, (*size, channels), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(path, format=fmt)
    return path


def write_folder(root: Path, counts: Dict[str, int], seed: int = 0, suffixes: Sequence[str] = (".png", ".jpg"),
                 size=(10, 12)) -> Path:
    """`counts[class]` images per class folder under `root`, alternating the suffixes; each class has its own mean
    brightness, so a small network can learn them."""
    rng = np.random.default_rng(seed)
    for index, (name, count) in enumerate(sorted(counts.items())):
        for i in range(count):
            path = root / name / f"img{i:03d}{suffixes[i % len(suffixes)]}"
            path.parent.mkdir(parents=True, exist_ok=True)
            base = 40 + 170 * index / max(1, len(counts) - 1)
            pixels = np.clip(rng.normal(base, 25, (*size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(path)
    return root
