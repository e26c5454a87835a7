"""Learning-rate schedules as one value per optimizer update, the dynamic-LR list MindSpore optimizers take.

The optimizer indexes the list with its ``global_step``, which the TrainingWrapper advances once per
applied update (once per accumulation window), so a schedule is written in updates, not micro-batches.
``updates_per_epoch`` may be fractional (an epoch of 1562 micro-batches with 4 per update has 390.5): update
``i`` belongs to epoch ``floor(i / updates_per_epoch)`` and the run has ``ceil(epochs * updates_per_epoch)``.
Every schedule here starts with an optional linear warm-up: update ``i < W`` uses ``lr * (i + 1) / W``
with ``W = round(warmup_epochs * updates_per_epoch)``.
"""
from __future__ import annotations

import logging
import math
from typing import List, Sequence

import numpy as np

log = logging.getLogger("trainkit")


def constant(lr: float, epochs: int, updates_per_epoch: float, warmup_epochs: float = 0) -> List[float]:
    """``lr`` after the warm-up."""
    total, warmup = _lengths(lr, epochs, updates_per_epoch, warmup_epochs)
    return _with_warmup(np.full(total, lr), lr, warmup)


def step(lr: float, epochs: int, updates_per_epoch: float, milestones: Sequence[int] = (30, 60, 80),
         gamma: float = 0.1, warmup_epochs: float = 0) -> List[float]:
    """``lr * gamma ** (number of milestones <= epoch)`` after the warm-up, epochs counted from 0."""
    total, warmup = _lengths(lr, epochs, updates_per_epoch, warmup_epochs)
    milestones = list(milestones)
    if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in milestones) or milestones != sorted(
            milestones):
        raise ValueError(f"milestones must be increasing epoch numbers >= 1; got {milestones}")
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0; got {gamma}")
    beyond = [m for m in milestones if m >= epochs]
    if beyond:
        log.warning("lr_schedule.milestones %s are not before the last epoch (%d): the rate never drops there",
                    beyond, epochs)
    epoch = np.floor(np.arange(total) / updates_per_epoch)
    drops = np.searchsorted(np.asarray(milestones), epoch, side="right")
    return _with_warmup(lr * gamma ** drops, lr, warmup)


def cosine(lr: float, epochs: int, updates_per_epoch: float, warmup_epochs: float = 1,
           min_lr: float = 0.0) -> List[float]:
    """Warm-up, then ``min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2`` with t going from 0 to 1 over the rest."""
    total, warmup = _lengths(lr, epochs, updates_per_epoch, warmup_epochs)
    if not 0 <= min_lr <= lr:
        raise ValueError(f"min_lr must be in [0, lr={lr}]; got {min_lr}")
    decay_steps = max(total - warmup - 1, 1)
    t = np.clip((np.arange(total) - warmup) / decay_steps, 0.0, 1.0)
    return _with_warmup(min_lr + (lr - min_lr) * 0.5 * (1 + np.cos(math.pi * t)), lr, warmup)


def _lengths(lr: float, epochs: int, updates_per_epoch: int, warmup_epochs: float):
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0; got {lr}")
    if epochs < 1 or not updates_per_epoch > 0:
        raise ValueError(f"epochs must be >= 1 and updates_per_epoch > 0; got {epochs} and {updates_per_epoch}")
    if not 0 <= warmup_epochs <= epochs:
        raise ValueError(f"warmup_epochs must be in [0, epochs={epochs}]; got {warmup_epochs}")
    total = max(math.ceil(epochs * updates_per_epoch - 1e-9), 1)
    return total, min(int(round(warmup_epochs * updates_per_epoch)), total)


def _with_warmup(values: np.ndarray, lr: float, warmup: int) -> List[float]:
    values = np.asarray(values, dtype=np.float64).copy()
    values[:warmup] = lr * np.arange(1, warmup + 1) / warmup
    return [float(v) for v in values]
