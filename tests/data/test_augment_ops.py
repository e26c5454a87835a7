"""trainkit's augmentation ops (trainkit.data.augment_ops) against torchvision's functional ops on fixed images.

Each RandAugment/AutoAugment op, at several magnitudes, is compared with torchvision's op on a uint8 tensor (its
own implementation, in torch), given the argument timm's tables give that magnitude -- written out below from
timm's ``auto_augment.py``, not read from the code under test. Tolerances, on 0..255 pixels: the pointwise ops
agree within rounding (mean absolute difference <= 1: PIL's contrast blends with the mean grey rounded to a
byte, torch's with it unrounded; every pixel within 2); the geometric ones (bilinear, PIL
against torch's grid_sample, which differ by half a pixel at a shear's origin) within a mean of 3, while the same
op with the opposite sign is at least 3 times further (so the tolerance tells the geometries apart). At magnitude
9 no op gives a near-constant picture (pixel std < 5) unless torchvision's does, and 200 seeded RandAugment draws
give about as many near-constant pictures as torchvision's RandAugment (0 each; MindSpore's gave 50).
"""
import math
import random
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from bench.shapes import SHAPES, shape_image
from tests.common.torch_zoo import import_zoo, torch
from trainkit.data import augment_ops
from trainkit.data.augment_ops import (
    AutoAugment,
    RandAugment,
    RandomHorizontalFlip,
    RandomResizedCrop,
    apply_op,
    op_argument,
    resized_crop_box,
)

FILL = (124, 116, 104)  # ImageNet's mean in bytes: timm's fill
MAGNITUDES = (1, 5, 9, 10)
NEAR_CONSTANT = 5.0  # pixel std below which a picture says nothing


def timm_argument(name, m):
    """timm's level -> argument tables (auto_augment.py, _LEVEL_DENOM = 10), positive sign."""
    return {"Rotate": 30 * m / 10, "ShearX": 0.3 * m / 10, "ShearY": 0.3 * m / 10,
            "TranslateXRel": 0.45 * m / 10, "TranslateYRel": 0.45 * m / 10,
            "Color": 1.8 * m / 10 + 0.1, "Contrast": 1.8 * m / 10 + 0.1, "Brightness": 1.8 * m / 10 + 0.1,
            "Sharpness": 1.8 * m / 10 + 0.1, "Posterize": int(4 * m / 10), "PosterizeOriginal": int(4 * m / 10) + 4,
            "Solarize": min(256, int(256 * m / 10)), "SolarizeAdd": min(128, int(110 * m / 10))}.get(name)


def fixed_images():
    """Three shapes, and a shape over a full-range gradient (so solarize and autocontrast have pixels to move)."""
    rng = np.random.default_rng(5)
    images = [shape_image(kind, rng) for kind in SHAPES[:3]]
    gradient = np.repeat(np.linspace(0, 255, 40)[None, :, None], 40, axis=0).repeat(3, axis=2)
    images.append(np.where(shape_image("cross", rng) > 128, 255 - gradient, gradient).astype(np.uint8))
    return images


def torchvision_op(name, image, argument):
    """torchvision's functional op on the image as a uint8 CHW tensor, the same argument, back as HWC float."""
    torchvision, _ = import_zoo()
    F = torchvision.transforms.functional
    bilinear = torchvision.transforms.InterpolationMode.BILINEAR
    tensor = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()
    height, width = image.shape[:2]
    fill = list(FILL)
    if name == "ShearX":  # PIL's (1, f, 0, 0, 1, 0): x reads x + f y, about the top-left corner
        out = F.affine(tensor, 0.0, [0, 0], 1.0, [math.degrees(math.atan(argument)), 0.0], bilinear, fill,
                       center=[0, 0])
    elif name == "ShearY":
        out = F.affine(tensor, 0.0, [0, 0], 1.0, [0.0, math.degrees(math.atan(argument))], bilinear, fill,
                       center=[0, 0])
    elif name == "TranslateXRel":  # the picture moves left by argument x width
        out = F.affine(tensor, 0.0, [-argument * width, 0], 1.0, [0.0, 0.0], bilinear, fill)
    elif name == "TranslateYRel":
        out = F.affine(tensor, 0.0, [0, -argument * height], 1.0, [0.0, 0.0], bilinear, fill)
    elif name == "Rotate":
        out = F.rotate(tensor, argument, bilinear, fill=fill)
    elif name in ("Posterize", "PosterizeOriginal"):
        out = tensor if argument >= 8 else F.posterize(tensor, int(argument))
    elif name == "Solarize":
        out = tensor if argument > 255 else F.solarize(tensor, argument)
    elif name == "SolarizeAdd":  # no torchvision twin: NumPy, as timm's lookup table says
        return np.where(image < 128, np.minimum(255, image.astype(int) + argument), image).astype(float)
    else:
        function = {"AutoContrast": F.autocontrast, "Equalize": F.equalize, "Invert": F.invert,
                    "Color": F.adjust_saturation, "Contrast": F.adjust_contrast,
                    "Brightness": F.adjust_brightness, "Sharpness": F.adjust_sharpness}[name]
        out = function(tensor) if argument is None else function(tensor, argument)
    return out.permute(1, 2, 0).numpy().astype(float)


def ours(name, image, magnitude, sign=1):
    argument = op_argument(name, magnitude)
    argument = None if argument is None else sign * argument
    return np.asarray(apply_op(Image.fromarray(image), name, argument, FILL)).astype(float)


ALL_OPS = augment_ops.RAND_OPS + ("PosterizeOriginal",)


@pytest.mark.parametrize("name", ALL_OPS)
def test_each_op_matches_torchvision_at_timm_magnitudes(name):
    """Mutations caught: rotate's sign flipped (Rotate red); the enhance
    factor on a /30 scale (Color red: the argument differs from timm's)."""
    for magnitude in MAGNITUDES:
        expected_argument = timm_argument(name, magnitude)
        assert op_argument(name, magnitude) == pytest.approx(expected_argument), (name, magnitude)
        for image in fixed_images():
            theirs = torchvision_op(name, image, expected_argument)
            difference = np.abs(ours(name, image, magnitude) - theirs)
            assert difference.shape == image.shape
            if name in augment_ops.SIGNED:
                mirrored = np.abs(ours(name, image, magnitude, sign=-1) - theirs).mean()
                assert difference.mean() <= 3.0, (name, magnitude, difference.mean())
                assert mirrored >= 3 * max(difference.mean(), 0.2), (name, magnitude, difference.mean(), mirrored)
            else:
                assert difference.mean() <= 1.0 and difference.max() <= 2, (name, magnitude, difference.mean())


@pytest.mark.parametrize("name", ALL_OPS)
def test_no_op_wipes_the_picture_at_magnitude_9_unless_torchvisions_does(name):
    """Mutation caught: posterize keeping int(m / 10) bits, 0 at m9 (a black picture: red)."""
    for image in fixed_images():
        for sign in ((1, -1) if name in augment_ops.SIGNED else (1,)):
            argument = timm_argument(name, 9)
            theirs = torchvision_op(name, image, None if argument is None else sign * argument)
            if ours(name, image, 9, sign).std() < NEAR_CONSTANT:
                assert theirs.std() < NEAR_CONSTANT, (name, sign)


def test_signed_ops_take_a_random_sign_the_others_none():
    rng = random.Random(0)
    for name in ALL_OPS:
        arguments = [op_argument(name, 9, rng) for _ in range(300)]
        if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
            negative = sum(a < 0 for a in arguments)
            assert 100 < negative < 200 and len({abs(a) for a in arguments}) == 1, (name, negative)
        else:
            assert all(a is None or a >= 0 for a in arguments) and len(set(arguments)) == 1, name


def test_the_tables_are_timms():
    """The op list and the ImageNet policy equal timm's own (where timm is installed); magnitudes clamp to 10."""
    _, timm = import_zoo()
    from timm.data import auto_augment as timm_aa

    assert tuple(timm_aa._RAND_TRANSFORMS) == augment_ops.RAND_OPS
    theirs = [tuple((op.name, op.prob, op.magnitude) for op in sub)
              for sub in timm_aa.auto_augment_policy_original({})]
    assert augment_ops.POLICIES["imagenet"] == theirs
    assert op_argument("Rotate", 30) == op_argument("Rotate", 10) == 30.0


def test_the_cifar10_and_svhn_policies_are_torchvisions():
    """The paper's CIFAR-10 and SVHN policies as torchvision lists them: the same ops, probabilities and levels
    (translations relative, posterize on the paper's 4..8 bits, a level for the ops that take none)."""
    torchvision, _ = import_zoo()
    T = torchvision.transforms
    renamed = {"TranslateX": "TranslateXRel", "TranslateY": "TranslateYRel", "Posterize": "PosterizeOriginal"}
    for name, policy in (("cifar10", T.AutoAugmentPolicy.CIFAR10), ("svhn", T.AutoAugmentPolicy.SVHN)):
        theirs = [tuple((renamed.get(op, op), prob, level or 0) for op, prob, level in sub)
                  for sub in T.AutoAugment(policy)._get_policies(policy)]
        assert augment_ops.POLICIES[name] == theirs, name


def test_randaugment_draws_ops_with_replacement_each_applied_with_probability_half(monkeypatch):
    """2 ops per image from timm's 15, each applied with p = 0.5: over 3000 images the count of applied ops is
    Binomial(2, 0.5) and every op is drawn about 1/15 of the time. Mutation caught: prob 1.0 (red)."""
    applied = []
    monkeypatch.setattr(augment_ops, "apply_op", lambda image, name, argument, fill: applied.append(name) or image)
    op = RandAugment(2, 9, FILL, seed=0)
    counts = Counter()
    image = fixed_images()[0]
    for _ in range(3000):
        before = len(applied)
        op(image)
        counts[len(applied) - before] += 1
    assert abs(counts[0] / 3000 - 0.25) < 0.03 and abs(counts[1] / 3000 - 0.5) < 0.03, counts
    frequency = Counter(applied)
    assert set(frequency) == set(augment_ops.RAND_OPS)
    assert all(abs(n / len(applied) - 1 / 15) < 0.02 for n in frequency.values()), frequency


def test_200_randaugment_draws_keep_the_picture_as_torchvisions_do():
    """rand-m9-n2 on 200 shape images: near-constant pictures (std < 5) no more than torchvision's RandAugment(2, 9)
    gives on the same images (+2). MindSpore's RandAugment gave 50 of 200, torchvision 0."""
    torchvision, _ = import_zoo()
    rng = np.random.default_rng(0)
    images = [shape_image(SHAPES[i % 4], rng) for i in range(200)]
    op = RandAugment(2, 9, FILL, seed=0)
    ours_constant = sum(op(image).std() < NEAR_CONSTANT for image in images)
    torch.manual_seed(0)
    reference = torchvision.transforms.RandAugment(2, 9)
    theirs_constant = sum(np.asarray(reference(Image.fromarray(image))).std() < NEAR_CONSTANT for image in images)
    assert ours_constant <= theirs_constant + 2, (ours_constant, theirs_constant)


def test_autoaugment_applies_one_sub_policy_with_its_probabilities(monkeypatch):
    applied = []
    monkeypatch.setattr(augment_ops, "apply_op", lambda image, name, argument, fill: applied.append(name) or image)
    op = AutoAugment("imagenet", FILL, seed=0)
    image = fixed_images()[0]
    for _ in range(2000):
        op(image)
    # each sub-policy is drawn 1/25 of the time; its ops with their probabilities: the expected share of each op
    expected = Counter()
    for sub in augment_ops.POLICIES["imagenet"]:
        for name, prob, _level in sub:
            expected[name] += prob / 25 * 2000
    for name, count in expected.items():
        assert abs(Counter(applied)[name] - count) < 4 * math.sqrt(count) + 5, (name, Counter(applied)[name], count)


def test_random_resized_crop_draws_as_torchvision_and_falls_back_to_its_centre_crop():
    """Per case (image size, scale, ratio from a seeded generator): every box is inside the image and either
    within scale and ratio (up to rounding) or torchvision's fallback centre crop; the fallback's share and the mean
    area share agree with torchvision's get_params over 200 draws. Mutation caught: fallback to the whole image
    (red: the fallback boxes differ)."""
    torchvision, _ = import_zoo()
    get_params = torchvision.transforms.RandomResizedCrop.get_params
    cases = random.Random(0)
    torch.manual_seed(0)
    for _ in range(30):
        height, width = cases.randint(8, 60), cases.randint(8, 60)
        low = cases.uniform(0.05, 1.0)
        scale = (low, cases.uniform(low, 1.0))
        r = cases.uniform(0.3, 3.0)
        ratio = (r, r * cases.uniform(1.0, 2.0))
        image = torch.zeros(3, height, width)
        in_ratio = width / height
        if in_ratio < ratio[0]:
            fallback_h, fallback_w = int(round(width / ratio[0])), width
        elif in_ratio > ratio[1]:
            fallback_h, fallback_w = height, int(round(height * ratio[1]))
        else:
            fallback_h, fallback_w = height, width
        fallback = ((height - fallback_h) // 2, (width - fallback_w) // 2, fallback_h, fallback_w)
        rng = random.Random(1)
        mine = [resized_crop_box(rng, height, width, scale, ratio) for _ in range(200)]
        theirs = [tuple(get_params(image, list(scale), list(ratio))) for _ in range(200)]
        for top, left, h, w in mine:
            assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0
            rounded_area = (math.sqrt(scale[0] * height * width) - 1) ** 2 <= h * w
            if (top, left, h, w) != fallback:
                assert rounded_area and (h * w) <= (math.sqrt(scale[1] * height * width) + 1) ** 2 * 1.5
        for boxes in (mine, theirs):
            assert all(b == fallback or b[2] * b[3] > 0 for b in boxes)
        share = [sum(b == fallback for b in boxes) / 200 for boxes in (mine, theirs)]
        assert abs(share[0] - share[1]) < 0.15, (height, width, scale, ratio, share)
        area = [np.mean([b[2] * b[3] for b in boxes]) / (height * width) for boxes in (mine, theirs)]
        assert abs(area[0] - area[1]) < 0.1, (height, width, scale, ratio, area)


def test_random_resized_crop_resizes_its_box_as_torchvision_does():
    """The op's output is torchvision's resized_crop (bilinear, antialiased) of the box it drew: mean difference
    <= 1.5 on 0..255 (PIL's and torch's bilinear differ by rounding)."""
    torchvision, _ = import_zoo()
    F = torchvision.transforms.functional
    op = RandomResizedCrop(24, seed=3)
    for image in fixed_images():
        replay = random.Random()
        replay.setstate(op.rng.getstate())  # the box the op is about to draw
        top, left, h, w = resized_crop_box(replay, 40, 40, (0.08, 1.0), (3 / 4, 4 / 3))
        out = op(image).astype(float)
        tensor = torch.from_numpy(image).permute(2, 0, 1).contiguous()
        theirs = F.resized_crop(tensor, top, left, h, w, [24, 24], torchvision.transforms.InterpolationMode.BILINEAR,
                                antialias=True).permute(1, 2, 0).numpy().astype(float)
        assert out.shape == (24, 24, 3) and np.abs(out - theirs).mean() <= 1.5, np.abs(out - theirs).mean()


def test_horizontal_flip_mirrors_with_its_probability():
    image = fixed_images()[0]
    op = RandomHorizontalFlip(0.3, seed=0)
    outputs = [op(image) for _ in range(1000)]
    flipped = [np.array_equal(out, image[:, ::-1]) for out in outputs]
    assert all(f or np.array_equal(out, image) for f, out in zip(flipped, outputs))
    assert abs(sum(flipped) / 1000 - 0.3) < 0.05
