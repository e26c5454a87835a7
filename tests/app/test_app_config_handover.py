"""The app hands the config over faithfully: what a run records is checked against arithmetic done here.

One run of TinyMLP (weights from NumPy) through ``train(cfg)`` with ``wrapper.loss_scale=dynamic`` and its
value, factor and window set, clipping, ``amp=O2``, momentum and a cosine schedule, on data with one planted
NaN batch. Every step's record must show the loss scale of the rule ``DynamicLossScaler`` documents (with
this config's numbers, so swapping factor and window fails), the gradient norm before clipping of the NumPy
reference, and the cosine rate of the update just applied, computed here from the schedule's formula.
"""
import math

import mindspore.dataset as ds
import numpy as np
import pytest

from tests.common.callbacks import read_jsonl
from tests.common.models import IN_FEATURES, initial_weights
from tests.common.reference import ReferenceTrainer, SGDMomentum
from trainkit.app import train
from trainkit.app.config import compose_config

BATCH, STEPS_PER_EPOCH, EPOCHS, PLANTED_STEP = 8, 6, 2, 5  # the 5th batch of an epoch holds a NaN
LR, MIN_LR, MOMENTUM, MAX_NORM = 0.05, 0.005, 0.9, 0.5
SCALE, FACTOR, WINDOW = 1024.0, 4, 3


def planted_arrays():
    rng = np.random.RandomState(41)
    images = rng.randn(BATCH * STEPS_PER_EPOCH, IN_FEATURES).astype(np.float32)
    labels = rng.randint(0, 3, BATCH * STEPS_PER_EPOCH).astype(np.int32)
    images[(PLANTED_STEP - 1) * BATCH + 2, 1] = np.nan
    return images, labels


class PlantedNaNData:
    """Feature vectors in a fixed order, one batch with a NaN: the data-module protocol the app uses."""

    num_classes = 3
    values_checked = True  # the NaN batch is the point: the app's first-epoch value check must let it through

    def __init__(self, batch_size: int):
        self.batch_size = batch_size

    def prepare(self) -> None:
        pass

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        images, labels = planted_arrays()
        return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False, num_shards=num_shards,
                                     shard_id=shard_id).batch(self.batch_size, drop_remainder=True)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        images, labels = planted_arrays()
        finite = np.isfinite(images).all(axis=1)
        return ds.NumpySlicesDataset({"image": images[finite], "label": labels[finite]}, shuffle=False).batch(8)


def cosine_rate(update: int) -> float:
    """Linear warm-up over the first epoch's updates, then a cosine from LR to MIN_LR at the last update."""
    total, warmup = EPOCHS * STEPS_PER_EPOCH, STEPS_PER_EPOCH
    if update < warmup:
        return LR * (update + 1) / warmup
    t = (update - warmup) / (total - warmup - 1)
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * t)) / 2


def test_loss_scale_clipping_amp_and_schedule_reach_the_wrapper_as_configured(graph_mode, tmp_path):
    conf = tmp_path / "conf"
    for group in ("model", "data"):
        (conf / group).mkdir(parents=True)
    (conf / "model" / "tiny_mlp.yaml").write_text("_target_: tests.common.models.TinyMLP\nbatch_norm: false\n")
    (conf / "data" / "planted.yaml").write_text(f"_target_: {__name__}.PlantedNaNData\nbatch_size: {BATCH}\n")
    cfg = compose_config([
        f"hydra.searchpath=[file://{conf}]", "model=tiny_mlp", "data=planted", "optimizer=momentum",
        f"optimizer.lr={LR}", f"optimizer.momentum={MOMENTUM}", "optimizer.weight_decay=0.0", "lr_schedule=cosine",
        "lr_schedule.warmup_epochs=1", f"lr_schedule.min_lr={MIN_LR}", "amp=O2", "wrapper.loss_scale=dynamic",
        f"wrapper.loss_scale_value={SCALE}", f"wrapper.scale_factor={FACTOR}", f"wrapper.scale_window={WINDOW}",
        f"wrapper.max_grad_norm={MAX_NORM}", f"trainer.epochs={EPOCHS}", "trainer.save_checkpoints=false",
        "trainer.max_nonfinite_steps=0", "logger.log_every_n_steps=1", "logger.progress=off",
        f"run_dir={tmp_path / 'run'}"])
    result = train(cfg)
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in records] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))

    # The loss scale, by DynamicLossScaler's documented rule with this config's numbers.
    scale, good, expected_scales, skipped = SCALE, 0, [], []
    for step in range(1, EPOCHS * STEPS_PER_EPOCH + 1):
        expected_scales.append(scale)
        planted = (step - 1) % STEPS_PER_EPOCH == PLANTED_STEP - 1  # every epoch
        skipped.append(planted)
        if planted:
            scale, good = max(1.0, scale / FACTOR), 0
        else:
            good += 1
            if good == WINDOW:
                scale, good = scale * FACTOR, 0
    assert [r["train/loss_scale"] for r in records] == expected_scales
    assert expected_scales[:7] == [1024.0] * 3 + [4096.0] * 2 + [1024.0] * 2  # grown, then backed off
    assert [r["train/skipped_steps"] for r in records] == list(np.cumsum(skipped))

    # The rate of the update each step applied (a skipped step applies none: the previous one's is shown).
    applied = np.cumsum([not s for s in skipped])
    expected_rates = [cosine_rate(max(int(n) - 1, 0)) for n in applied]
    np.testing.assert_allclose([r["train/learning_rate"] for r in records], expected_rates, rtol=1e-6)
    assert len(set(np.round(expected_rates, 6))) > 8  # warm-up and decay both seen

    # The gradient norm before clipping, from the float64 reference trained the same way (O2: float16 compute).
    images, labels = planted_arrays()
    reference = ReferenceTrainer(initial_weights(), SGDMomentum(LR, MOMENTUM), max_grad_norm=MAX_NORM,
                                 loss_scale=SCALE, scale_factor=FACTOR, scale_window=WINDOW)
    for step in range(EPOCHS * STEPS_PER_EPOCH):
        reference.optimizer.lr = cosine_rate(reference.optimizer_steps)
        batch = slice((step % STEPS_PER_EPOCH) * BATCH, (step % STEPS_PER_EPOCH + 1) * BATCH)
        reference.micro_step(images[batch], labels[batch])
    assert reference.scales_used == expected_scales and reference.overflows == skipped
    finite = [i for i, s in enumerate(skipped) if not s]
    assert min(reference.grad_norms[i] for i in finite) > MAX_NORM  # clipping acts on every applied step
    np.testing.assert_allclose([records[i]["train/grad_norm"] for i in finite],
                               [reference.grad_norms[i] for i in finite], rtol=2e-2)
    assert result.metrics["amp_level"] == 2  # O2 ran, read from the network
    assert result.metrics["skipped_steps"] == EPOCHS and result.metrics["optimizer_steps"] == len(finite)
    for name, value in reference.params.items():  # the clipped, scheduled updates landed as computed
        np.testing.assert_allclose(result.network.parameters_dict()[name].asnumpy(), value, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("update, rate", [(0, LR / STEPS_PER_EPOCH), (STEPS_PER_EPOCH, LR),
                                          (EPOCHS * STEPS_PER_EPOCH - 1, MIN_LR)])
def test_the_tests_cosine_has_its_end_points(update, rate):
    assert cosine_rate(update) == pytest.approx(rate)
