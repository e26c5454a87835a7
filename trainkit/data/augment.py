"""Image augmentations as config: ``data.augment=PRESET`` or ``data.augment={preset: P, key: value, ...}``.

timm's set, with timm's definitions (:mod:`trainkit.data.augment_ops`, written on Pillow: MindSpore's own
``RandAugment`` is not timm's), run inside the ``mindspore.dataset`` pipeline in one thread, so an exact resume
(``trainer.resume_data=exact``) replays their draws:

* per image, in this order: ``RandomResizedCrop`` (``random_resized_crop``, ``scale``, ``ratio``; without it the
  evaluation's resize and centre crop), ``RandomHorizontalFlip`` (``hflip``: its probability), ``RandAugment``
  (``auto_augment=randaugment``, ``randaugment_ops``, ``randaugment_magnitude``: timm's ``rand-mM-nN``) or
  ``AutoAugment`` (``auto_augment=autoaugment``, ``autoaugment_policy``), then ``Normalize`` by ``mean``/``std``
  (of pixels in [0, 1]; also applied to evaluation and prediction, which get nothing else but the resize and
  centre crop); the geometric ops of RandAugment and AutoAugment fill with ``mean`` in bytes, as timm's do;
* per batch: timm's ``Mixup`` (``mode='batch'``, :class:`trainkit.data.augment_ops.MixUpCutMix`): MixUp
  (``mixup_alpha`` > 0) and CutMix (``cutmix_alpha`` > 0), applied to a batch with probability ``mix_prob``; with
  both on, each batch picks one of the two with equal chance (timm's ``switch_prob=0.5``). One lambda ~ Beta(alpha,
  alpha) for the batch, which is mixed with itself reversed: MixUp blends the images, CutMix pastes one box (side
  share sqrt(1 - lambda), uniform centre, clipped) and weights the labels by the area the box leaves. The training
  labels become the mixed one-hot targets (float32 ``(batch, classes)``), which ``loss=cross_entropy`` takes as
  class probabilities (with its label smoothing).

Label smoothing is the loss's (``loss.label_smoothing``), not an augmentation.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import mindspore as ms
from mindspore.dataset import transforms, vision

from trainkit.checks import check_bool, did_you_mean
from trainkit.data import augment_ops
from trainkit.data.augment_ops import POLICIES
from trainkit.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO_AUGMENTS = ("randaugment", "autoaugment")


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
    randaugment_magnitude: float = 9
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
    return _check(replace(Augment(), **{**PRESETS[preset], **keys}))


def describe(augment: Augment) -> Dict[str, Any]:
    """The keys as plain values (a repr, a log line)."""
    return asdict(augment)


def _check(a: Augment) -> Augment:
    """`a` checked, its lists as Python lists of floats (Hydra passes a ListConfig, YAML and Python a list)."""
    check_bool("data.augment.random_resized_crop", a.random_resized_crop)
    for name, low in (("scale", 0.0), ("ratio", 0.0)):
        pair = _numbers(getattr(a, name), 2)
        if pair is None or not low < pair[0] <= pair[1] or (name == "scale" and pair[1] > 1):
            valid = "0 < min <= max <= 1" if name == "scale" else "0 < min <= max"
            raise ConfigError(f"data.augment.{name} must be [min, max] with {valid}; got {_plain(getattr(a, name))!r}")
        a = replace(a, **{name: pair})
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
    if not _real(a.randaugment_magnitude) or not 0 <= a.randaugment_magnitude <= augment_ops.LEVEL_DENOM:
        raise ConfigError(f"data.augment.randaugment_magnitude must be a number in [0, 10] (timm's scale: "
                          f"rand-m9 is 9); got {a.randaugment_magnitude!r}")
    for name in ("mean", "std"):
        values = _numbers(getattr(a, name), 3)
        if values is None or (name == "std" and min(values) <= 0):
            valid = "three numbers > 0" if name == "std" else "three numbers"
            raise ConfigError(f"data.augment.{name} must be {valid} (red, green, blue, of pixels in [0, 1]); got "
                              f"{_plain(getattr(a, name))!r}")
        a = replace(a, **{name: values})
    return a


def _numbers(value: Any, count: int) -> Optional[List[float]]:
    """`value` as `count` floats when it is a sequence (list, tuple, OmegaConf's ListConfig) of that many reals."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != count:
        return None
    items = list(value)
    return [float(v) for v in items] if all(_real(v) for v in items) else None


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else value


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
    one thread: each op draws from its own stream in sample order, so the draws do not depend on
    ``num_parallel_workers``, a key a resume may change."""
    size = (image_size, image_size)
    before: list = []
    random: list = []
    if train and augment.random_resized_crop:
        random.append(augment_ops.RandomResizedCrop(image_size, scale=augment.scale, ratio=augment.ratio))
    else:
        before += [vision.Resize(image_size), vision.CenterCrop(size)]
    if train and augment.hflip > 0:
        random.append(augment_ops.RandomHorizontalFlip(prob=float(augment.hflip)))
    fill = augment_ops.fill_of(augment.mean)
    if train and augment.auto_augment == "randaugment":
        random.append(augment_ops.RandAugment(num_ops=int(augment.randaugment_ops),
                                              magnitude=float(augment.randaugment_magnitude), fill=fill))
    elif train and augment.auto_augment == "autoaugment":
        random.append(augment_ops.AutoAugment(policy=augment.autoaugment_policy, fill=fill))
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
    return [augment_ops.MixUpCutMix(float(augment.mixup_alpha), float(augment.cutmix_alpha), float(augment.mix_prob))]
