"""Image augmentations as config: ``data.augment=PRESET`` or ``data.augment={preset: P, key: value, ...}``.

The timm/mindcv set, each a MindSpore ``mindspore.dataset`` op (so the pipeline replays them on an exact resume,
``trainer.resume_data=exact``, and they run in MindSpore's C++ workers):

* per image, in this order: ``RandomResizedCrop`` (``random_resized_crop``, ``scale``, ``ratio``; without it the
  evaluation's resize and centre crop), ``RandomHorizontalFlip`` (``hflip``: its probability), ``RandAugment``
  (``auto_augment=randaugment``, ``randaugment_ops``, ``randaugment_magnitude``) or ``AutoAugment``
  (``auto_augment=autoaugment``, ``autoaugment_policy``), then ``Normalize`` by ``mean``/``std`` (of pixels in
  [0, 1]; also applied to evaluation and prediction, which get nothing else but the resize and centre crop);
* per batch: ``MixUpBatch`` (``mixup_alpha`` > 0) and ``CutMixBatch`` (``cutmix_alpha`` > 0), applied to a batch
  with probability ``mix_prob``; with both on, each batch picks one of the two with equal chance (timm's
  ``switch_prob=0.5``). MixUp mixes the whole batch with one weight lambda ~ Beta(alpha, alpha) and a shuffled copy
  of itself; CutMix pastes into each image a box of another, its lambda ~ Beta(alpha, alpha) and its label weight
  the share of the image the box leaves. The training labels become the mixed one-hot targets (float32
  ``(batch, classes)``), which ``loss=cross_entropy`` takes as class probabilities (with its label smoothing).

Label smoothing is the loss's (``loss.label_smoothing``), not an augmentation.
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import mindspore as ms
from mindspore.dataset import transforms, vision

from trainkit.checks import check_bool, did_you_mean
from trainkit.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO_AUGMENTS = ("randaugment", "autoaugment")
POLICIES = {"imagenet": vision.AutoAugmentPolicy.IMAGENET, "cifar10": vision.AutoAugmentPolicy.CIFAR10,
            "svhn": vision.AutoAugmentPolicy.SVHN}


@dataclass(frozen=True)
class Augment:
    """What ``data.augment`` sets; the defaults are the ``none`` preset (resize, centre crop, normalise)."""

    preset: str = "none"
    random_resized_crop: bool = False
    scale: List[float] = field(default_factory=lambda: [0.08, 1.0])
    ratio: List[float] = field(default_factory=lambda: [3 / 4, 4 / 3])
    hflip: float = 0.0
    auto_augment: Optional[str] = None
    randaugment_ops: int = 2
    randaugment_magnitude: int = 9
    autoaugment_policy: str = "imagenet"
    mean: List[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: List[float] = field(default_factory=lambda: list(IMAGENET_STD))
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_prob: float = 1.0

    @property
    def mixes(self) -> bool:
        """Whether training batches are mixed (their labels are then one-hot targets)."""
        return self.mix_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)


# name -> the keys it sets (the rest keep their defaults); timm's recipes: light (flip and crop), RandAugment
# rand-m9-n2, AutoAugment's ImageNet policy, and DeiT's strong recipe (RandAugment + MixUp 0.8 + CutMix 1.0).
PRESETS: Dict[str, Dict[str, Any]] = {
    "none": {},
    "light": {"random_resized_crop": True, "hflip": 0.5},
    "randaugment": {"random_resized_crop": True, "hflip": 0.5, "auto_augment": "randaugment"},
    "autoaugment": {"random_resized_crop": True, "hflip": 0.5, "auto_augment": "autoaugment"},
    "strong": {"random_resized_crop": True, "hflip": 0.5, "auto_augment": "randaugment", "mixup_alpha": 0.8,
               "cutmix_alpha": 1.0},
}
KEYS = tuple(f.name for f in fields(Augment))


def parse_augment(value: Union[None, str, Mapping[str, Any]]) -> Augment:
    """``data.augment`` as an :class:`Augment`: a preset name, or a mapping of keys over its ``preset`` (default
    ``none``). Raises ConfigError naming ``data.augment`` or the key and what is valid."""
    if value is None:
        value = "none"
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"data.augment must be a preset ({', '.join(PRESETS)}) or a mapping of its keys; "
                          f"got {value!r}")
    keys = {str(k): v for k, v in value.items()}
    preset = keys.get("preset", "none")
    if preset not in PRESETS:
        raise ConfigError(f"data.augment.preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    unknown = sorted(set(keys) - set(KEYS))
    if unknown:
        raise ConfigError(f"data.augment.{unknown[0]} is not a key of data.augment: "
                          f"{did_you_mean(unknown[0], KEYS, 'data.augment.')}valid keys: {', '.join(KEYS)}")
    augment = replace(Augment(), **{**PRESETS[preset], **keys})
    _check(augment)
    return augment


def describe(augment: Augment) -> Dict[str, Any]:
    """The keys as plain values (a repr, a log line)."""
    return asdict(augment)


def _check(a: Augment) -> None:
    check_bool("data.augment.random_resized_crop", a.random_resized_crop)
    for name, pair, low in (("scale", a.scale, 0.0), ("ratio", a.ratio, 0.0)):
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(_real(v) for v in pair)
                or not low < pair[0] <= pair[1] or (name == "scale" and pair[1] > 1)):
            valid = "0 < min <= max <= 1" if name == "scale" else "0 < min <= max"
            raise ConfigError(f"data.augment.{name} must be [min, max] with {valid}; got {pair!r}")
    for name in ("hflip", "mix_prob"):
        value = getattr(a, name)
        if not _real(value) or not 0 <= value <= 1:
            raise ConfigError(f"data.augment.{name} must be a probability in [0, 1]; got {value!r}")
    for name in ("mixup_alpha", "cutmix_alpha"):
        value = getattr(a, name)
        if not _real(value) or value < 0:
            raise ConfigError(f"data.augment.{name} must be a number >= 0 (0: off); got {value!r}")
    if a.auto_augment is not None and a.auto_augment not in AUTO_AUGMENTS:
        raise ConfigError(f"data.augment.auto_augment must be null, {' or '.join(AUTO_AUGMENTS)}; got "
                          f"{a.auto_augment!r}")
    if a.autoaugment_policy not in POLICIES:
        raise ConfigError(f"data.augment.autoaugment_policy must be one of {', '.join(POLICIES)}; got "
                          f"{a.autoaugment_policy!r}")
    if not _whole(a.randaugment_ops) or a.randaugment_ops < 1:
        raise ConfigError(f"data.augment.randaugment_ops must be an int >= 1; got {a.randaugment_ops!r}")
    if not _whole(a.randaugment_magnitude) or not 0 <= a.randaugment_magnitude < 31:
        raise ConfigError(f"data.augment.randaugment_magnitude must be an int in [0, 30]; got "
                          f"{a.randaugment_magnitude!r}")
    for name in ("mean", "std"):
        values = getattr(a, name)
        if (not isinstance(values, (list, tuple)) or len(values) != 3 or not all(_real(v) for v in values)
                or (name == "std" and min(values) <= 0)):
            valid = "three numbers > 0" if name == "std" else "three numbers"
            raise ConfigError(f"data.augment.{name} must be {valid} (red, green, blue, of pixels in [0, 1]); got "
                              f"{values!r}")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def image_ops(augment: Augment, image_size: int, train: bool) -> list:
    """The per-image ops after ``Decode`` (uint8 HWC in, float32 CHW out): the training ones when `train`, else
    the evaluation's (resize the shorter side, centre crop, normalise), which prediction uses too."""
    return [op for stage in image_stages(augment, image_size, train) for op in stage]


def image_stages(augment: Augment, image_size: int, train: bool) -> Tuple[list, list, list]:
    """:func:`image_ops` in three stages: the deterministic ops before the random ones, the random ones (empty
    for evaluation or without augmentation), the deterministic ones after. A pipeline runs the random stage in
    one thread: MindSpore gives each thread of a map its own random stream, so the draws would otherwise depend
    on ``num_parallel_workers``, a key a resume may change."""
    size = (image_size, image_size)
    before: list = []
    random: list = []
    if train and augment.random_resized_crop:
        random.append(vision.RandomResizedCrop(size, scale=tuple(augment.scale), ratio=tuple(augment.ratio)))
    else:
        before += [vision.Resize(image_size), vision.CenterCrop(size)]
    if train and augment.hflip > 0:
        random.append(vision.RandomHorizontalFlip(prob=float(augment.hflip)))
    if train and augment.auto_augment == "randaugment":
        random.append(vision.RandAugment(num_ops=int(augment.randaugment_ops),
                                         magnitude=int(augment.randaugment_magnitude)))
    elif train and augment.auto_augment == "autoaugment":
        random.append(vision.AutoAugment(policy=POLICIES[augment.autoaugment_policy]))
    after = [vision.Normalize([255.0 * m for m in augment.mean], [255.0 * s for s in augment.std]), vision.HWC2CHW()]
    return before, random, after


def label_ops(augment: Augment, num_classes: int, train: bool) -> list:
    """Labels as int32 class indices, or, for mixed training batches, float32 one-hot rows (mixed after batching)."""
    if train and augment.mixes:
        return [transforms.OneHot(num_classes), transforms.TypeCast(ms.float32)]
    return [transforms.TypeCast(ms.int32)]


def batch_ops(augment: Augment) -> list:
    """The ops on a batch's ("image", "label") columns: MixUp and/or CutMix with probability ``mix_prob``."""
    if not augment.mixes:
        return []
    mixers = []
    if augment.mixup_alpha > 0:
        mixers.append(vision.MixUpBatch(alpha=float(augment.mixup_alpha)))
    if augment.cutmix_alpha > 0:
        mixers.append(vision.CutMixBatch(vision.ImageBatchFormat.NCHW, alpha=float(augment.cutmix_alpha), prob=1.0))
    mixer = mixers[0] if len(mixers) == 1 else transforms.RandomChoice(mixers)
    return [mixer if augment.mix_prob >= 1 else transforms.RandomApply([mixer], prob=float(augment.mix_prob))]
