"""Learning-rate schedules, one value per optimizer update, against values worked out by hand."""
import math

import pytest

from trainkit.parts import lr_schedule


def test_constant_with_linear_warmup():
    values = lr_schedule.constant(0.1, epochs=3, updates_per_epoch=4, warmup_epochs=1)
    assert values == pytest.approx([0.025, 0.05, 0.075, 0.1] + [0.1] * 8)


def test_step_drops_at_each_milestone_epoch():
    values = lr_schedule.step(1.0, epochs=4, updates_per_epoch=2, milestones=[1, 3], gamma=0.5)
    assert values == pytest.approx([1, 1, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25])


def test_cosine_goes_from_lr_after_warmup_to_min_lr_at_the_last_update():
    lr, min_lr, total, warmup = 0.2, 0.02, 10, 2
    values = lr_schedule.cosine(lr, epochs=5, updates_per_epoch=2, warmup_epochs=1, min_lr=min_lr)
    expected = [lr * 1 / 2, lr * 2 / 2]
    for i in range(warmup, total):
        t = (i - warmup) / (total - warmup - 1)
        expected.append(min_lr + (lr - min_lr) * (1 + math.cos(math.pi * t)) / 2)
    assert values == pytest.approx(expected)
    assert values[-1] == pytest.approx(min_lr)


@pytest.mark.parametrize("call, message", [
    (lambda: lr_schedule.constant(0.0, 1, 1), "lr must be"),
    (lambda: lr_schedule.constant(0.1, 2, 3, warmup_epochs=3), "warmup_epochs must be in [0, epochs=2]"),
    (lambda: lr_schedule.step(0.1, 2, 3, milestones=[5, 2]), "milestones must be increasing"),
    (lambda: lr_schedule.step(0.1, 2, 3, gamma=0), "gamma must be > 0"),
    (lambda: lr_schedule.cosine(0.1, 2, 3, min_lr=0.5), "min_lr must be in [0, lr=0.1]"),
])
def test_bad_schedule_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_fractional_updates_per_epoch_place_epochs_exactly():
    # 5 micro-batches an epoch, 2 per update: 2.5 updates an epoch; ceil(7.5) = 8 rates for 3 epochs (the 8th
    # window is incomplete and never applied)
    values = lr_schedule.step(1.0, epochs=3, updates_per_epoch=2.5, milestones=[1, 2], gamma=0.5)
    # update i is in epoch floor(i / 2.5): 0, 0, 0, 1, 1, 2, 2, 2
    assert values == pytest.approx([1, 1, 1, 0.5, 0.5, 0.25, 0.25, 0.25])
