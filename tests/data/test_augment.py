"""data.augment: the presets and keys parse with one-line errors, and MixUp/CutMix mix batches and targets as
their arithmetic says, checked with NumPy.

MixUp and CutMix (timm's Mixup, mode='batch') draw their lambda and box inside the op; the tests read each
sample's partner and weight from the mixed one-hot target (every sample of the batch has a class of its own), then
check the mixed images against NumPy arithmetic on the original batch for that draw: timm pairs the batch with its
reverse and draws one lambda (and one box) for the whole batch. A fixed seed gives the same batch twice (what an
exact resume replays).
"""
import math
from collections import Counter

import mindspore.dataset as ds
import numpy as np
import pytest

from trainkit.data.augment import PRESETS, batch_ops, label_ops, parse_augment
from trainkit.errors import ConfigError

BATCH, CLASSES, SIDE = 8, 8, 6


def mixed_batches(augment, seed=7, batches=1):
    """Batches of BATCH images (sample i has class i) through the label and batch ops of `augment`."""
    rng = np.random.default_rng(0)
    images = rng.random((BATCH * batches, 3, SIDE, SIDE)).astype(np.float32)
    labels = np.tile(np.arange(BATCH, dtype=np.int32), batches)
    ds.config.set_seed(seed)
    dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)
    dataset = dataset.map(label_ops(augment, CLASSES, train=True), "label").batch(BATCH)
    dataset = dataset.map(batch_ops(augment), ["image", "label"])
    out = list(dataset.create_tuple_iterator(output_numpy=True, num_epochs=1))
    return images.reshape(batches, BATCH, 3, SIDE, SIDE), [(b[0], b[1]) for b in out]


def partners(target):
    """Per sample: (its own weight, the other class's index or itself)."""
    own = target[np.arange(BATCH), np.arange(BATCH)]
    others = target.copy()
    others[np.arange(BATCH), np.arange(BATCH)] = 0
    return own, np.where(others.max(axis=1) > 0, others.argmax(axis=1), np.arange(BATCH))


def test_mixup_mixes_the_batch_with_one_lambda_and_a_permutation():
    """Mutation caught: a random permutation for timm's reversed batch (red: the partners)."""
    (originals,), [(mixed, target)] = mixed_batches(parse_augment({"mixup_alpha": 0.4}))
    assert target.dtype == np.float32 and target.shape == (BATCH, CLASSES)
    np.testing.assert_allclose(target.sum(axis=1), 1.0, rtol=1e-6)
    own, partner = partners(target)
    lam = own[partner != np.arange(BATCH)]
    assert len(lam) and np.allclose(lam, lam[0], atol=1e-6) and 0 < lam[0] < 1  # one lambda for the batch
    assert list(partner) == list(range(BATCH))[::-1]  # timm: the batch mixed with itself reversed
    expected = lam[0] * originals + (1 - lam[0]) * originals[partner]  # NumPy: the mixed batch
    expected[partner == np.arange(BATCH)] = originals[partner == np.arange(BATCH)]
    np.testing.assert_allclose(mixed, expected, rtol=1e-5, atol=1e-6)
    expected_target = lam[0] * np.eye(CLASSES)[np.arange(BATCH)] + (1 - lam[0]) * np.eye(CLASSES)[partner]
    expected_target[partner == np.arange(BATCH)] = np.eye(CLASSES)[np.flatnonzero(partner == np.arange(BATCH))]
    np.testing.assert_allclose(target, expected_target, rtol=1e-5, atol=1e-6)
    again = mixed_batches(parse_augment({"mixup_alpha": 0.4}))[1][0]
    np.testing.assert_array_equal(again[0], mixed)  # a fixed seed: the same draw (replayed on resume)
    np.testing.assert_array_equal(again[1], target)


def test_cutmix_pastes_a_box_and_weights_the_target_by_its_area():
    """One box for the batch, pasted from the reversed batch. Mutation caught: the box cut across channels and
    rows (NHWC taken for NCHW: red)."""
    (originals,), [(mixed, target)] = mixed_batches(parse_augment({"cutmix_alpha": 1.0}))
    own, partner = partners(target)
    assert list(partner) == list(range(BATCH))[::-1] or (partner == np.arange(BATCH)).all()  # reversed (or no box)
    boxes = set()
    for i in range(BATCH):
        changed = (mixed[i] != originals[i]).any(axis=0)  # [H, W]: the pixels that came from the partner
        rows, cols = np.flatnonzero(changed.any(axis=1)), np.flatnonzero(changed.any(axis=0))
        box = np.zeros_like(changed)
        if len(rows):
            box[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = True
        boxes.add(box.tobytes())
        j = partner[i]
        # NumPy: the image is its partner inside a rectangle, itself outside (a pixel equal in both may not show)
        expected = np.where(box[None], originals[j], originals[i])
        np.testing.assert_array_equal(mixed[i], expected)
        if j != i:
            area = box.sum() / (SIDE * SIDE)
            assert own[i] == pytest.approx(1 - area, abs=1e-6), (i, own[i], area)
            assert target[i, j] == pytest.approx(area, abs=1e-6)
    assert len(boxes) == 1  # timm's batch mode: one box for the whole batch


def test_cutmix_boxes_are_timms_rand_bbox():
    """The area share of 3000 boxes (alpha 1: lambda uniform) against timm's rand_bbox written in NumPy: side share
    sqrt(1 - lambda), centre uniform, clipped. Means and quartiles within 0.03."""
    import random

    from trainkit.data.augment_ops import cutmix_box

    rng, reference = random.Random(0), np.random.default_rng(0)
    ours, theirs = [], []
    for _ in range(3000):
        top, bottom, left, right = cutmix_box(rng, 24, 20, rng.betavariate(1, 1))
        ours.append((bottom - top) * (right - left) / (24 * 20))
        cut = np.sqrt(1 - reference.beta(1, 1))
        cut_h, cut_w = int(24 * cut), int(20 * cut)
        cy, cx = reference.integers(0, 24), reference.integers(0, 20)
        rows = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, 24)
        cols = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, 20)
        theirs.append((rows[1] - rows[0]) * (cols[1] - cols[0]) / (24 * 20))
    np.testing.assert_allclose(np.quantile(ours, [0.25, 0.5, 0.75]), np.quantile(theirs, [0.25, 0.5, 0.75]),
                               atol=0.03)
    assert abs(np.mean(ours) - np.mean(theirs)) < 0.03


def test_presets_and_keys():
    strong = parse_augment("strong")
    assert strong.random_resized_crop and strong.hflip == 0.5 and strong.auto_augment == "randaugment"
    assert strong.mixup_alpha == 0.8 and strong.cutmix_alpha == 1.0 and strong.mixes
    custom = parse_augment({"preset": "light", "hflip": 0.25, "mean": [0.5, 0.5, 0.5]})
    assert custom.random_resized_crop and custom.hflip == 0.25 and custom.mean == [0.5, 0.5, 0.5]
    assert not parse_augment(None).mixes and set(PRESETS) >= {"none", "light", "randaugment", "autoaugment"}
    assert batch_ops(parse_augment("light")) == []


@pytest.mark.parametrize("value, message", [
    ("heavy", "data.augment.preset must be one of none, light, randaugment, autoaugment, strong; got 'heavy'"),
    ({"mixup": 0.2}, "data.augment.mixup is not a key of data.augment: did you mean data.augment.mixup_alpha?"),
    ({"hflip": 2}, "data.augment.hflip must be a probability in [0, 1]; got 2"),
    ({"cutmix_alpha": -1}, "data.augment.cutmix_alpha must be a number >= 0"),
    ({"scale": [0.5, 0.1]}, "data.augment.scale must be [min, max] with 0 < min <= max <= 1"),
    ({"randaugment_magnitude": 15}, "data.augment.randaugment_magnitude must be a number in [0, 10] (timm's scale"),
    ({"ratio": [1.0]}, "data.augment.ratio must be [min, max] with 0 < min <= max; got [1.0]"),
    ({"auto_augment": "trivial"}, "data.augment.auto_augment must be null, randaugment or autoaugment"),
    ({"std": [0.2, 0, 0.2]}, "data.augment.std must be three numbers > 0"),
    (3, "data.augment must be a preset"),
])
def test_bad_values_name_the_key(value, message):
    with pytest.raises(ConfigError) as error:
        parse_augment(value)
    assert message in str(error.value) and "\n" not in str(error.value)


def kind_of(original, mixed, target):
    """How a batch came out: "untouched", "mixup" (every sample a blend of itself and its partner by the one lambda
    of the batch) or "cutmix" (every pixel its own or its partner's), read from the arithmetic alone."""
    if np.array_equal(target, np.eye(CLASSES)[:BATCH]) and np.array_equal(mixed, original):
        return "untouched"
    own, partner = partners(target)
    lam = own[partner != np.arange(BATCH)]
    if len(lam) and np.allclose(lam, lam[0], atol=1e-6):
        blend = lam[0] * original + (1 - lam[0]) * original[partner]
        blend[partner == np.arange(BATCH)] = original[partner == np.arange(BATCH)]
        if np.allclose(mixed, blend, rtol=1e-5, atol=1e-6) and not np.all(
                (mixed == original) | (mixed == original[partner])):
            return "mixup"
    if np.all((mixed == original) | (mixed == original[partner])):
        return "cutmix"
    raise AssertionError(f"neither MixUp nor CutMix: lambdas {own}, partners {partner}")


def tolerance(batches, p, sigmas=4.0):
    """The binomial count's allowed distance from batches * p: `sigmas` standard deviations (a seeded draw; a fair
    one lands outside with probability about 6e-5)."""
    return sigmas * math.sqrt(batches * p * (1 - p))


def test_with_mixup_and_cutmix_both_on_each_batch_picks_one_at_even_odds():
    """200 batches with mixup_alpha and cutmix_alpha both set (mix_prob 1): every batch is mixed (but for CutMix's
    empty boxes), by MixUp in a
    binomial(200, 0.5) share of them (4 standard deviations, computed here). Mutation: batch_ops always taking the
    first mixer (MixUp in all 200 batches: red)."""
    batches = 200
    originals, out = mixed_batches(parse_augment({"mixup_alpha": 1.0, "cutmix_alpha": 1.0}), batches=batches)
    kinds = Counter(kind_of(o, m, t) for o, (m, t) in zip(originals, out))
    # timm's CutMix box (rand_bbox) keeps nothing on these 6x6 images when its side int(6 sqrt(1 - lambda)) < 2,
    # lambda > 8/9: 1/9 of the CutMix half; a MixUp batch is never untouched
    empty = 0.5 / 9
    assert kinds["untouched"] <= batches * empty + tolerance(batches, empty), kinds
    assert abs(kinds["mixup"] - batches * 0.5) <= tolerance(batches, 0.5), kinds


def test_mix_prob_is_the_share_of_mixed_batches():
    """mix_prob=0.2 over 200 batches: a binomial(200, 0.2) count of mixed batches (4 standard deviations: 40 +- 23).
    Mutation: RandomApply given 1 - mix_prob (about 160 mixed: red)."""
    batches, mix_prob = 200, 0.2
    for augment in ({"mixup_alpha": 1.0}, {"cutmix_alpha": 1.0}, {"mixup_alpha": 1.0, "cutmix_alpha": 1.0}):
        originals, out = mixed_batches(parse_augment({**augment, "mix_prob": mix_prob}), batches=batches)
        kinds = Counter(kind_of(o, m, t) for o, (m, t) in zip(originals, out))
        mixed = batches - kinds["untouched"]
        assert abs(mixed - batches * mix_prob) <= tolerance(batches, mix_prob), (augment, kinds)


@pytest.mark.parametrize("given", ["command line", "yaml"])
def test_scale_ratio_mean_std_are_settable_from_the_command_line_and_yaml(given, tmp_path):
    """Hydra hands lists over as OmegaConf ListConfigs: they were refused ("must be [min, max]", exit 2) even at
    their defaults. Mutation caught: _numbers accepting list/tuple only (both cases red)."""
    from trainkit.app.config import compose_config
    from trainkit.app.tool_config import build_data

    keys = "{preset: light, scale: [0.25, 0.75], ratio: [0.5, 2], mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}"
    if given == "yaml":
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "mine.yaml").write_text(
            f"defaults:\n  - image_folder\n  - _self_\nroot: {tmp_path}\naugment: {keys}\n")
        overrides = [f"hydra.searchpath=[file://{tmp_path}]", "data=mine"]
    else:
        overrides = ["data=image_folder", f"data.root={tmp_path}", f"data.augment={keys}"]
    augment = build_data(compose_config([*overrides, f"run_dir={tmp_path / 'run'}"])).augment
    assert (augment.scale, augment.ratio) == ([0.25, 0.75], [0.5, 2.0])
    assert (augment.mean, augment.std) == ([0.5] * 3, [0.25] * 3)
    assert augment.random_resized_crop and augment.hflip == 0.5
