"""The pre-compile fit check compares the output's width with the data's classes, whatever the model's key."""
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Accuracy

from trainkit.app.fit_check import check_fit
from trainkit.errors import ConfigError


class FocalLoss(nn.Cell):
    """A loss of the user's own: nothing in its type says classification."""

    def construct(self, logits, labels):
        return (logits * 0).sum() + labels.astype(logits.dtype).mean() * 0


def digits_like(classes=10):
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(8, 4)).astype(np.float32), "y": (np.arange(8) % classes).astype(np.int32)}
    return ds.NumpySlicesDataset(data, shuffle=False).batch(4)


@pytest.mark.parametrize("loss, metrics", [
    (nn.CrossEntropyLoss(), {}),
    (nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), {}),
    (FocalLoss(), {"accuracy": Accuracy()}),
], ids=["cross_entropy", "softmax_cross_entropy", "own_loss_and_accuracy"])
def test_an_8_wide_head_for_10_classes_is_refused_before_compiling(loss, metrics):
    head_size = 8  # the user's key for the width is not num_classes: the check reads the output itself
    with pytest.raises(ConfigError, match="gives 8 scores per sample, but the data has 10 classes: set the model's "
                                          "output width to at least 10"):
        check_fit(nn.Dense(4, head_size), loss, digits_like(), "loss=x", "model=y", metrics, num_classes=10)
    for fits in (10, 12):  # a wider head is allowed, as model.num_classes above the data's is
        check_fit(nn.Dense(4, fits), loss, digits_like(), "loss=x", "model=y", metrics, num_classes=10)


def test_no_classification_loss_or_metric_no_width_check():
    check_fit(nn.Dense(4, 8), FocalLoss(), digits_like(), "loss=x", "model=y", {}, num_classes=10)
    check_fit(nn.Dense(4, 8), nn.CrossEntropyLoss(), digits_like(), "loss=x", "model=y", {}, num_classes=None)
