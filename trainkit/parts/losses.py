"""Losses trainkit ships beyond MindSpore's own: cross-entropy on class indices with optional label smoothing.

Any Cell called as ``loss(network_output, label)`` and returning a scalar can be the ``loss`` group's
``_target_``; the shipped options (``trainkit/configs/loss``) are this class and MindSpore's ``MSELoss``,
``L1Loss``, ``SmoothL1Loss`` and ``BCEWithLogitsLoss``.
"""
from __future__ import annotations

from mindspore import nn

from trainkit.checks import check_number


class CrossEntropy(nn.Cell):
    """Mean softmax cross-entropy of logits ``(batch, classes)`` against integer class indices ``(batch,)``.

    ``label_smoothing=0`` is MindSpore's fused ``SoftmaxCrossEntropyWithLogits(sparse=True)`` (what trainkit always
    used, so recipes train exactly as before); ``label_smoothing=e > 0`` is ``nn.CrossEntropyLoss(label_smoothing=e)``
    (targets ``(1 - e)`` on the class and ``e / classes`` spread over all, as PyTorch's). Chosen in ``__init__``.

    Labels ``(batch, classes)`` of floats are class probabilities (the mixed targets of MixUp/CutMix,
    ``data.augment``): ``nn.CrossEntropyLoss(label_smoothing=e)`` takes them, smoothing them as PyTorch does
    (``(1 - e) p + e / classes``). The label's rank is known when the graph compiles, so the choice costs nothing.

    Args:
        label_smoothing: in [0, 1).

    Raises:
        ConfigError: `label_smoothing` out of range (a TypeError subclass for a wrong type).
    """

    sparse_labels = True  # the pre-compile fit check: labels are class indices, so they must be integers

    def __init__(self, label_smoothing: float = 0.0):
        super().__init__()
        self.label_smoothing = float(check_number("label_smoothing", label_smoothing, "a number in [0, 1)",
                                                  lambda v: 0 <= v < 1))
        if self.label_smoothing > 0:
            self.loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=self.label_smoothing)
        else:
            self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.soft_loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=self.label_smoothing)

    def construct(self, logits, labels):
        if labels.ndim == 2:  # class probabilities (mixed targets): a compile-time choice
            return self.soft_loss(logits, labels)
        return self.loss(logits, labels)
