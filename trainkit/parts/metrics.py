"""Evaluation metrics trainkit adds to MindSpore's: the loss averaged over samples, not over batches."""
from __future__ import annotations

import numpy as np
from mindspore.train import Loss


class SampleMeanLoss(Loss):
    """The evaluation loss as the mean over every sample, whatever the batch sizes.

    MindSpore's ``Loss`` metric averages the batches' mean losses, so a smaller last batch weighs as much as a full
    one: on 10 samples in batches of 4, 4 and 2, each of the last two samples counts twice as much as the others.
    trainkit's evaluation network gives the loss once per sample (``Float32EvalCell``); this metric sums them and
    divides by their number. It stays a ``Loss`` so that ``Model`` hands it the loss output.
    """

    def clear(self) -> None:
        self._sum_loss = 0.0
        self._total_num = 0

    def update(self, *inputs) -> None:
        if len(inputs) != 1:
            raise ValueError(f"SampleMeanLoss.update takes 1 input (the per-sample losses), got {len(inputs)}")
        losses = np.asarray(self._convert_data(inputs[0]), dtype=np.float64).reshape(-1)
        self._sum_loss += float(losses.sum())
        self._total_num += losses.size

    def eval(self) -> float:
        if self._total_num == 0:
            raise RuntimeError("SampleMeanLoss has no sample: update() was never called")
        return self._sum_loss / self._total_num
