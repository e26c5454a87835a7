"""Small images of coloured shapes (circle, square, triangle, cross) on a plain background, for the augmentation
checks and the augmentation accuracy row: the class is the shape, so an augmentation that wipes the picture out
costs accuracy."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "cross")


def shape_image(kind: str, rng: np.random.Generator, size: int = 40) -> np.ndarray:
    """One HWC uint8 RGB image of shape `kind`: random colours, position, size; a little pixel noise."""
    dark = rng.random() < 0.5  # a light shape on a dark ground, or the reverse
    light, deep = rng.integers(150, 256, 3), rng.integers(0, 100, 3)
    background, colour = (tuple(int(v) for v in c) for c in ((deep, light) if dark else (light, deep)))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    radius = rng.uniform(0.18, 0.32) * size
    cx, cy = rng.uniform(radius + 1, size - radius - 1, 2)
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if kind == "circle":
        draw.ellipse(box, fill=colour)
    elif kind == "square":
        draw.rectangle(box, fill=colour)
    elif kind == "triangle":
        draw.polygon([(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], fill=colour)
    else:
        bar = radius / 3
        draw.rectangle((cx - radius, cy - bar, cx + radius, cy + bar), fill=colour)
        draw.rectangle((cx - bar, cy - radius, cx + bar, cy + radius), fill=colour)
    pixels = np.asarray(image, dtype=np.int16) + rng.integers(-6, 7, (size, size, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def write_shapes(root: Path, per_class: Dict[str, int], seed: int = 0, size: int = 40) -> Path:
    """`per_class[split]` PNGs per shape under root/<split>/<shape>/ (splits: train, val, test)."""
    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for kind in SHAPES:
            folder = Path(root) / split / kind
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(shape_image(kind, rng, size)).save(folder / f"{i:04d}.png")
    return Path(root)
