"""The random per-image augmentations, as timm defines them, written on Pillow for ``mindspore.dataset`` pipelines.

MindSpore's own ``RandAugment`` is not timm's (about a quarter of its draws at magnitude 9 are a near-constant
picture), so these ops follow timm 1.0's ``timm.data.auto_augment`` and ``RandomResizedCropAndInterpolation``
(as timm's ``create_transform(is_training=True)`` builds them, interpolation bilinear):

* :class:`RandAugment` -- ``rand-mM-nN``: N ops drawn with replacement from timm's 15 (:data:`RAND_OPS`), applied
  in the order drawn, each with probability 0.5; magnitude M on timm's scale (``level / 10`` of each op's range,
  M clamped to [0, 10]); signed ops (rotate, shear, translate) take a random sign; geometric ops fill with the
  normalisation mean in bytes (``round(255 * mean)``) and translate up to 45% of the side at M = 10.
* :class:`AutoAugment` -- a policy of sub-policies (:data:`POLICIES`): one drawn per image, each of its two ops
  applied with its own probability at its own level, on the same scale. ``imagenet`` is timm's ``original``
  (the paper's ImageNet policy); ``cifar10`` and ``svhn`` are the paper's, as torchvision lists them.
* :class:`RandomResizedCrop` -- torchvision's and timm's: area share uniform in ``scale``, aspect ratio
  log-uniform in ``ratio``, up to 10 attempts, then a centre crop at the nearest allowed ratio.
* :class:`RandomHorizontalFlip` -- with probability ``prob``.

Each op is a callable on an image (NumPy HWC uint8 RGB or a PIL image) returning NumPy HWC uint8, with its own
``random.Random`` seeded from the pipeline's seed (``mindspore.dataset.config.get_seed()`` when it is built) and
the op's name. The pipeline calls it in one thread, in sample order, so its draws are a function of the seed and
of the samples before: ``trainer.resume_data=exact`` replays the pipeline and so replays them.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import mindspore.dataset as ds
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitude M is M/10 of each op's range
TRANSLATE_PCT = 0.45  # timm: translate up to 45% of the side at magnitude 10
BILINEAR = Image.Resampling.BILINEAR

ImageLike = Union[np.ndarray, Image.Image]

# -------------------------------------------------------------------------------------- the ops on a PIL image


def _affine(image: Image.Image, matrix: Tuple[float, ...], fill: Tuple[int, ...]) -> Image.Image:
    # PIL's AFFINE data maps each output pixel (x, y) to the input (a x + b y + c, d x + e y + f)
    return image.transform(image.size, Image.Transform.AFFINE, matrix, resample=BILINEAR, fillcolor=fill)


def shear_x(image: Image.Image, factor: float, fill: Tuple[int, ...]) -> Image.Image:
    """Shear about the top-left corner: output (x, y) reads input (x + factor y, y)."""
    return _affine(image, (1, factor, 0, 0, 1, 0), fill)


def shear_y(image: Image.Image, factor: float, fill: Tuple[int, ...]) -> Image.Image:
    """Output (x, y) reads input (x, factor x + y)."""
    return _affine(image, (1, 0, 0, factor, 1, 0), fill)


def translate_x(image: Image.Image, share: float, fill: Tuple[int, ...]) -> Image.Image:
    """Shift left by `share` of the width (right when negative)."""
    return _affine(image, (1, 0, share * image.size[0], 0, 1, 0), fill)


def translate_y(image: Image.Image, share: float, fill: Tuple[int, ...]) -> Image.Image:
    """Shift up by `share` of the height (down when negative)."""
    return _affine(image, (1, 0, 0, 0, 1, share * image.size[1]), fill)


def rotate(image: Image.Image, degrees: float, fill: Tuple[int, ...]) -> Image.Image:
    """Counter-clockwise about the centre, the corners filled."""
    return image.rotate(degrees, resample=BILINEAR, fillcolor=fill)


def solarize_add(image: Image.Image, add: int, threshold: int = 128) -> Image.Image:
    """Add `add` (clipped at 255) to the pixels below `threshold`."""
    table = [min(255, i + add) if i < threshold else i for i in range(256)]
    return image.point(table * len(image.getbands()))


def posterize(image: Image.Image, bits: int) -> Image.Image:
    """Keep the `bits` most significant bits of each pixel (8: unchanged; 0: black, as timm's magnitudes below 2.5
    ask -- Pillow's own posterize refuses 0 since Pillow 11)."""
    if bits >= 8:
        return image
    mask = 256 - 2 ** (8 - max(0, int(bits)))
    return image.point([i & mask for i in range(256)] * len(image.getbands()))


_NO_ARGUMENT: Dict[str, Callable[[Image.Image], Image.Image]] = {
    "AutoContrast": ImageOps.autocontrast, "Equalize": ImageOps.equalize, "Invert": ImageOps.invert}
_ENHANCE = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast, "Brightness": ImageEnhance.Brightness,
            "Sharpness": ImageEnhance.Sharpness}
_GEOMETRIC = {"Rotate": rotate, "ShearX": shear_x, "ShearY": shear_y, "TranslateXRel": translate_x,
              "TranslateYRel": translate_y}

# ------------------------------------------------------------------------ magnitude -> argument (timm's tables)
# Each takes the level (0..10) and a random.Random for the sign; ``None`` in SIGNED: the op has no sign.
_SCALES: Dict[str, Callable[[float], float]] = {
    "Rotate": lambda level: level / LEVEL_DENOM * 30.0,  # degrees, +-30 at 10
    "ShearX": lambda level: level / LEVEL_DENOM * 0.3,  # shear factor, +-0.3
    "ShearY": lambda level: level / LEVEL_DENOM * 0.3,
    "TranslateXRel": lambda level: level / LEVEL_DENOM * TRANSLATE_PCT,  # share of the side, +-0.45
    "TranslateYRel": lambda level: level / LEVEL_DENOM * TRANSLATE_PCT,
    "Color": lambda level: level / LEVEL_DENOM * 1.8 + 0.1,  # enhancement factor in [0.1, 1.9]
    "Contrast": lambda level: level / LEVEL_DENOM * 1.8 + 0.1,
    "Brightness": lambda level: level / LEVEL_DENOM * 1.8 + 0.1,
    "Sharpness": lambda level: level / LEVEL_DENOM * 1.8 + 0.1,
    "Posterize": lambda level: int(level / LEVEL_DENOM * 4),  # bits kept, 0..4 (RandAugment's)
    "PosterizeOriginal": lambda level: int(level / LEVEL_DENOM * 4) + 4,  # bits kept, 4..8 (AutoAugment's)
    "Solarize": lambda level: min(256, int(level / LEVEL_DENOM * 256)),  # threshold: pixels >= it inverted
    "SolarizeAdd": lambda level: min(128, int(level / LEVEL_DENOM * 110)),  # added below 128
}
SIGNED = frozenset(_GEOMETRIC)
RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def op_argument(name: str, level: float, rng: Optional[random.Random] = None) -> Optional[float]:
    """The argument op `name` takes at `level` (timm's table); a signed op's is negated with probability 0.5
    (drawn from `rng`; without one, positive)."""
    if name in _NO_ARGUMENT:
        return None
    value = _SCALES[name](max(0.0, min(float(level), LEVEL_DENOM)))
    if name in SIGNED and rng is not None and rng.random() > 0.5:
        return -value
    return value


def apply_op(image: Image.Image, name: str, argument: Optional[float], fill: Tuple[int, ...]) -> Image.Image:
    """Op `name` with its argument (:func:`op_argument`) on a PIL RGB image; geometric ops fill with `fill`."""
    if name in _NO_ARGUMENT:
        return _NO_ARGUMENT[name](image)
    if name in _ENHANCE:
        return _ENHANCE[name](image).enhance(argument)
    if name in _GEOMETRIC:
        return _GEOMETRIC[name](image, argument, fill)
    if name in ("Posterize", "PosterizeOriginal"):
        return posterize(image, int(argument))
    if name == "Solarize":
        return ImageOps.solarize(image, int(argument))
    if name == "SolarizeAdd":
        return solarize_add(image, int(argument))
    raise KeyError(name)


# -------------------------------------------------------------------------------------------------- policies
# (op, probability, level) pairs. imagenet: timm's auto_augment_policy_original; cifar10, svhn: the AutoAugment
# paper's (arXiv:1805.09501), as torchvision's _get_policies lists them, their translations relative (timm's
# TranslateRel at the same level: 45% of the side at 10) and posterize on the paper's 4..8 bits.
_P = "PosterizeOriginal"
POLICIES: Dict[str, List[Tuple[Tuple[str, float, int], ...]]] = {
    "imagenet": [
        ((_P, 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
        (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)), ((_P, 0.6, 7), (_P, 0.6, 6)),
        (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), ((_P, 0.8, 5), ("Equalize", 1.0, 2)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), (_P, 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
        (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
        (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
        (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    ],
    "cifar10": [
        (("Invert", 0.1, 0), ("Contrast", 0.2, 6)), (("Rotate", 0.7, 2), ("TranslateXRel", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)), (("ShearY", 0.5, 8), ("TranslateYRel", 0.7, 9)),
        (("AutoContrast", 0.5, 0), ("Equalize", 0.9, 0)), (("ShearY", 0.2, 7), (_P, 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)), (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, 0), ("Equalize", 0.5, 0)), (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateXRel", 0.5, 8)), (("Equalize", 0.3, 0), ("AutoContrast", 0.4, 0)),
        (("TranslateYRel", 0.4, 3), ("Sharpness", 0.2, 6)), (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, 0)), (("Equalize", 0.2, 0), ("AutoContrast", 0.6, 0)),
        (("Equalize", 0.2, 0), ("Equalize", 0.6, 0)), (("Color", 0.9, 9), ("Equalize", 0.6, 0)),
        (("AutoContrast", 0.8, 0), ("Solarize", 0.2, 8)), (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, 0)), (("TranslateYRel", 0.9, 9), ("TranslateYRel", 0.7, 9)),
        (("AutoContrast", 0.9, 0), ("Solarize", 0.8, 3)), (("Equalize", 0.8, 0), ("Invert", 0.1, 0)),
        (("TranslateYRel", 0.7, 9), ("AutoContrast", 0.9, 0)),
    ],
    "svhn": [
        (("ShearX", 0.9, 4), ("Invert", 0.2, 0)), (("ShearY", 0.9, 8), ("Invert", 0.7, 0)),
        (("Equalize", 0.6, 0), ("Solarize", 0.6, 6)), (("Invert", 0.9, 0), ("Equalize", 0.6, 0)),
        (("Equalize", 0.6, 0), ("Rotate", 0.9, 3)), (("ShearX", 0.9, 4), ("AutoContrast", 0.8, 0)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, 0)), (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, 0), ("AutoContrast", 0.8, 0)), (("Equalize", 0.6, 0), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)), (("ShearY", 0.8, 8), ("Invert", 0.7, 0)),
        (("Equalize", 0.9, 0), ("TranslateYRel", 0.6, 6)), (("Invert", 0.9, 0), ("Equalize", 0.6, 0)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)), (("Invert", 0.8, 0), ("TranslateYRel", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)), (("Invert", 0.6, 0), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateXRel", 0.9, 3)), (("ShearX", 0.1, 6), ("Invert", 0.6, 0)),
        (("Solarize", 0.7, 2), ("TranslateYRel", 0.6, 7)), (("ShearY", 0.8, 4), ("Invert", 0.8, 0)),
        (("ShearX", 0.7, 9), ("TranslateYRel", 0.8, 3)), (("ShearY", 0.8, 5), ("AutoContrast", 0.7, 0)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, 0)),
    ],
}

# --------------------------------------------------------------------------------------- the pipeline's ops


def fill_of(mean: Sequence[float]) -> Tuple[int, ...]:
    """timm's fill: the normalisation mean (of pixels in [0, 1]) in bytes."""
    return tuple(min(255, round(255 * m)) for m in mean)


def _pil(image: ImageLike) -> Image.Image:
    return image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))


class _RandomOp:
    """An op with its own random stream, seeded by the pipeline's seed and the op's name when built."""

    name = "op"

    def __init__(self, seed: Optional[int] = None):
        self.seed = ds.config.get_seed() if seed is None else int(seed)
        self.rng = random.Random(f"trainkit.{self.name}.{self.seed}")

    def __call__(self, image: ImageLike) -> np.ndarray:
        return np.asarray(self.apply(_pil(image)), dtype=np.uint8)

    def apply(self, image: Image.Image) -> Image.Image:
        raise NotImplementedError


class RandAugment(_RandomOp):
    """timm's ``rand-m{magnitude}-n{num_ops}``: `num_ops` ops drawn with replacement from :data:`RAND_OPS`,
    applied in the order drawn, each with probability `prob`, at `magnitude` (0..10), `fill` the bytes geometric
    ops fill with."""

    name = "randaugment"

    def __init__(self, num_ops: int = 2, magnitude: float = 9, fill: Tuple[int, ...] = (128, 128, 128),
                 prob: float = 0.5, seed: Optional[int] = None):
        super().__init__(seed)
        self.num_ops, self.magnitude, self.fill, self.prob = int(num_ops), float(magnitude), tuple(fill), prob

    def apply(self, image: Image.Image) -> Image.Image:
        for name in [self.rng.choice(RAND_OPS) for _ in range(self.num_ops)]:
            if self.prob < 1.0 and self.rng.random() > self.prob:
                continue
            image = apply_op(image, name, op_argument(name, self.magnitude, self.rng), self.fill)
        return image


class AutoAugment(_RandomOp):
    """AutoAugment: one sub-policy of ``POLICIES[policy]`` drawn per image, each of its ops applied with its own
    probability at its own level (timm's scale, random sign for the signed ops)."""

    name = "autoaugment"

    def __init__(self, policy: str = "imagenet", fill: Tuple[int, ...] = (128, 128, 128),
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.policy, self.fill = POLICIES[policy], tuple(fill)

    def apply(self, image: Image.Image) -> Image.Image:
        for name, prob, level in self.rng.choice(self.policy):
            if prob < 1.0 and self.rng.random() > prob:
                continue
            image = apply_op(image, name, op_argument(name, level, self.rng), self.fill)
        return image


def resized_crop_box(rng: random.Random, height: int, width: int, scale: Sequence[float],
                     ratio: Sequence[float]) -> Tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (timm's too): (top, left, height, width) of a crop whose area
    share is uniform in `scale` and aspect ratio (w / h) log-uniform in `ratio`; after 10 draws that do not fit,
    the centre crop at the allowed ratio nearest the image's."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop(_RandomOp):
    """A crop (:func:`resized_crop_box`) resized to `size` x `size`, bilinear (as torchvision's ``resized_crop``)."""

    name = "random_resized_crop"

    def __init__(self, size: int, scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.size, self.scale, self.ratio = int(size), tuple(scale), tuple(ratio)

    def apply(self, image: Image.Image) -> Image.Image:
        top, left, h, w = resized_crop_box(self.rng, image.size[1], image.size[0], self.scale, self.ratio)
        return image.crop((left, top, left + w, top + h)).resize((self.size, self.size), BILINEAR)


class RandomHorizontalFlip(_RandomOp):
    """Mirror left-right with probability `prob`."""

    name = "hflip"

    def __init__(self, prob: float = 0.5, seed: Optional[int] = None):
        super().__init__(seed)
        self.prob = float(prob)

    def apply(self, image: Image.Image) -> Image.Image:
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if self.rng.random() < self.prob else image


def cutmix_box(rng: random.Random, height: int, width: int, lam: float) -> Tuple[int, int, int, int]:
    """timm's ``rand_bbox``: (top, bottom, left, right) of a box of side share sqrt(1 - lam) about a uniform
    centre, clipped to the image."""
    ratio = math.sqrt(1 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = rng.randrange(height), rng.randrange(width)
    top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
    left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
    return top, bottom, left, right


class MixUpCutMix(_RandomOp):
    """timm's ``Mixup`` (``mode='batch'``) on a batch of images (NCHW float32) and one-hot targets (float32): with
    probability `mix_prob` the batch is mixed with itself reversed -- by CutMix (when on, and picked at even odds
    when MixUp is on too: timm's ``switch_prob=0.5``) or MixUp -- with one lambda ~ Beta(alpha, alpha) for the
    batch; CutMix pastes one box (:func:`cutmix_box`) and weights the targets by the area it leaves."""

    name = "mixup_cutmix"

    def __init__(self, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, mix_prob: float = 1.0,
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.mixup_alpha, self.cutmix_alpha, self.mix_prob = float(mixup_alpha), float(cutmix_alpha), float(mix_prob)

    def __call__(self, images: np.ndarray, targets: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        if self.mix_prob < 1.0 and self.rng.random() >= self.mix_prob:
            return images, targets
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or self.rng.random() < 0.5)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        lam = self.rng.betavariate(alpha, alpha)
        flipped = images[::-1]
        if use_cutmix:
            height, width = images.shape[-2:]
            top, bottom, left, right = cutmix_box(self.rng, height, width, lam)
            images = images.copy()
            images[..., top:bottom, left:right] = flipped[..., top:bottom, left:right]
            lam = 1.0 - (bottom - top) * (right - left) / (height * width)
        else:
            images = (images * lam + flipped * (1.0 - lam)).astype(images.dtype)
        return images, (targets * lam + targets[::-1] * (1.0 - lam)).astype(targets.dtype)
