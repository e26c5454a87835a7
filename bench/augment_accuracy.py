"""Augmentation accuracy row: the same folder of 40x40 shape images, the same network (SmallCNN), epochs and
loop, trained with trainkit's ``data.augment=randaugment`` and with torchvision's pipeline in its place.

    python -m bench.augment_accuracy [--repeats 3] [--epochs 12] [--out results/augment_accuracy.md]

Variants, each ``--repeats`` seeds (``trainer.seed`` 0..N-1), the test accuracy (``test_accuracy``: best.ckpt by
validation accuracy, on the held-out test/ folder):

* ``none``: resize and centre crop only;
* ``trainkit``: ``data.augment=randaugment`` (trainkit.data.augment_ops: timm's RandomResizedCrop, flip, rand-m9-n2);
* ``torchvision``: the random stage replaced by torchvision's ``RandomResizedCrop(S)``, ``RandomHorizontalFlip()``,
  ``RandAugment(2, 9)`` on PIL images (torch seeded from the run's seed), everything else equal;
* ``mindspore``: the random stage MindSpore's ``RandomResizedCrop``, ``RandomHorizontalFlip`` and
  ``RandAugment(2, 9)``, what trainkit ran before (for the record).

The images are written by bench.shapes (4 shapes, random colours and places). The markdown table goes to ``--out``;
bench/ may import torch (trainkit's core may not).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from bench.shapes import write_shapes
from trainkit.data.image_folder import ImageFolderData

VARIANTS = ("none", "trainkit", "torchvision", "mindspore")


def import_torchvision():
    """torchvision beside the CPU torch: the index's build needs the two operator schemas defined first."""
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018
    except (AttributeError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.library = library
    import torchvision

    return torch, torchvision


class _Torchvision:
    """torchvision's training transforms as one pipeline callable (NumPy HWC uint8 in and out)."""

    def __init__(self, size: int, seed: int, scale=(0.08, 1.0)):
        torch, torchvision = import_torchvision()
        from PIL import Image

        self.image = Image
        self.generator_seed = seed
        torch.manual_seed(seed)
        T = torchvision.transforms
        self.compose = T.Compose([T.RandomResizedCrop(size, scale=tuple(scale)), T.RandomHorizontalFlip(),
                                  T.RandAugment(2, 9)])

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return np.asarray(self.compose(self.image.fromarray(image)), dtype=np.uint8)


class VariantData(ImageFolderData):
    """ImageFolderData whose random stage is torchvision's or MindSpore's (``variant``), for this row only."""

    def __init__(self, variant: str = "torchvision", seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.variant, self.seed = variant, seed

    def image_stages(self, train: bool):
        before, random, after = super().image_stages(train)
        if not train:
            return before, random, after
        if self.variant == "torchvision":
            return before, [_Torchvision(self.image_size, self.seed, self.augment.scale)], after
        from mindspore.dataset import vision

        size = (self.image_size, self.image_size)
        return before, [vision.RandomResizedCrop(size, scale=tuple(self.augment.scale)), vision.RandomHorizontalFlip(),
                        vision.RandAugment(num_ops=2, magnitude=9)], after


def near_constant_counts(draws: int = 200, seed: int = 0) -> Dict[str, int]:
    """RandAugment(2, 9) on `draws` shape images: how many come out near-constant (pixel std < 5), for trainkit's,
    timm's own ``rand-m9-n2`` (its create_transform parameters: fill ImageNet's mean, bilinear), torchvision's and
    MindSpore's."""
    import random

    from mindspore.dataset import vision
    from PIL import Image

    from bench.shapes import SHAPES, shape_image
    from trainkit.data.augment_ops import RandAugment

    torch, torchvision = import_torchvision()
    from timm.data.auto_augment import rand_augment_transform

    rng = np.random.default_rng(seed)
    images = [shape_image(SHAPES[i % len(SHAPES)], rng) for i in range(draws)]
    fill = (124, 116, 104)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    timm_op = rand_augment_transform("rand-m9-n2", {"translate_const": 18, "img_mean": fill,
                                                     "interpolation": Image.Resampling.BILINEAR})
    pipelines = {"trainkit": RandAugment(2, 9, fill, seed=seed),
                 "timm": lambda image: np.asarray(timm_op(Image.fromarray(image))),
                 "torchvision": lambda image: np.asarray(torchvision.transforms.RandAugment(2, 9)(
                     Image.fromarray(image))),
                 "mindspore": vision.RandAugment(num_ops=2, magnitude=9)}
    return {name: int(sum(np.asarray(op(image)).std() < 5 for image in images)) for name, op in pipelines.items()}


def run_one(root: Path, variant: str, seed: int, epochs: int, run_dir: Path, batch_size: int = 32,
            scale: str = "0.08,1.0") -> float:
    from trainkit.app import train
    from trainkit.app.config import compose_config

    overrides = ["data=image_folder", f"data.root={root}", "data.image_size=40", f"data.batch_size={batch_size}",
                 "model=small_cnn", f"trainer.epochs={epochs}", f"trainer.seed={seed}", "logger=quiet",
                 f"run_dir={run_dir}", "data.num_parallel_workers=1"]
    if variant == "trainkit":
        overrides.append(f"data.augment={{preset: randaugment, scale: [{scale}]}}")
    elif variant in ("torchvision", "mindspore"):
        overrides += [f"data.augment={{preset: light, scale: [{scale}]}}", f"+data.variant={variant}",
                      f"+data.seed={seed}", "data._target_=bench.augment_accuracy.VariantData"]
    result = train(compose_config(overrides))
    return float(result.metrics["test_accuracy"])


def main(argv: List[str] = None) -> Dict[str, List[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--scale", default="0.08,1.0", help="RandomResizedCrop's area range, MIN,MAX (all variants)")
    parser.add_argument("--per-class", type=int, default=150, help="training images per shape")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--near-constant", action="store_true", help="only count near-constant RandAugment draws")
    parser.add_argument("--out", default=None, help="markdown file for the table (default: print only)")
    args = parser.parse_args(argv)
    if args.near_constant:
        print(near_constant_counts())
        return {}
    accuracies: Dict[str, List[float]] = {}
    with tempfile.TemporaryDirectory() as work:
        root = write_shapes(Path(work) / "shapes", {"train": args.per_class, "val": 25, "test": 100})
        for variant in args.variants.split(","):
            for seed in range(args.repeats):
                start = time.perf_counter()
                accuracy = run_one(root, variant, seed, args.epochs, Path(work) / f"{variant}-{seed}", args.batch_size,
                                   args.scale)
                accuracies.setdefault(variant, []).append(accuracy)
                print(f"{variant} seed {seed}: test accuracy {accuracy:.3f} ({time.perf_counter() - start:.0f} s)",
                      flush=True)
    lines = [f"{args.per_class} training images per shape (4 shapes), 25 validation, 100 test; 40x40; SmallCNN; "
             f"batch {args.batch_size}; {args.epochs} epochs; crop scale [{args.scale}].", "",
             f"| augmentation | test accuracy, seeds 0..{args.repeats - 1} | mean | std |", "|---|---|---|---|"]
    for variant, values in accuracies.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(f"| {variant} | {', '.join(f'{v:.3f}' for v in values)} | {statistics.mean(values):.3f} | "
                     f"{spread:.3f} |")
    if len(accuracies.get("trainkit", [])) > 1 and len(accuracies.get("torchvision", [])) > 1:
        from trainkit.app.sweep.summary import ALPHA, welch_p

        p = welch_p(accuracies["trainkit"], accuracies["torchvision"])
        lines += ["", f"trainkit against torchvision, as a sweep summary judges repeats: Welch's t-test p = {p:.2g} "
                      f"({'within noise' if p >= ALPHA else 'told apart'} at {ALPHA})."]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
    return accuracies


if __name__ == "__main__":
    main()
