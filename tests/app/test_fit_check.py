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


class Counted(nn.Dense):
    """A head that counts its forward passes."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def construct(self, x):
        self.calls += 1
        return super().construct(x)


def labelled(labels):
    data = {"x": np.ones((4, 4), np.float32), "y": np.asarray(labels, np.int32)}
    return ds.NumpySlicesDataset(data, shuffle=False).batch(4)


def test_a_check_that_passed_for_the_same_first_batch_is_not_run_again(tmp_path):
    """The compile cache folder (tmp_path here) records a passed check; the same inputs skip the forward pass and get
    the recorded answer, other inputs run it. Mutations tried: the batch's values left out of the fingerprint (red:
    the bad label passes), a failed check recorded (red), the record ignored (red: a second forward pass)."""
    head = Counted(4, 10)
    assert check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 2, 3]), "loss=x", "model=y", {}, 10,
                     passed_in=tmp_path) == 10
    assert head.calls == 1 and (tmp_path / "fit_check.json").exists()
    assert check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 2, 3]), "loss=x", "model=y", {}, 10,
                     passed_in=tmp_path) == 10
    assert head.calls == 1  # passed before with these inputs: no forward pass
    with pytest.raises(ConfigError, match="sample 2, is 11, but the model has 10 outputs"):
        check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 11, 3]), "loss=x", "model=y", {}, 10,
                  passed_in=tmp_path)  # another first batch: checked, and refused
    with pytest.raises(ConfigError, match="sample 2, is 11"):  # a failed check is not recorded as passed
        check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 11, 3]), "loss=x", "model=y", {}, 10,
                  passed_in=tmp_path)
    assert head.calls == 3
    with pytest.raises(ConfigError, match="gives 10 scores per sample, but the data has 12 classes"):
        check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 2, 3]), "loss=x", "model=y", {}, 12,
                  passed_in=tmp_path)  # the data says more classes: checked again
    assert check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 2, 3]), "loss=x", "model=y", {}, None) == 10
    assert head.calls == 5  # without a folder: always checked


@pytest.mark.parametrize("damage", ["garbage", "list", "no_outputs", "text_outputs"])
def test_a_damaged_record_runs_the_check_again_and_is_rewritten(tmp_path, damage):
    """A record someone else wrote or a crash cut short never stands for a passed check. The record of a pass is
    rewritten with its inputs kept and its answer replaced as `damage` says; the next call runs the forward pass.
    Mutation tried: the record's "outputs" read with .get (red: a record without it skipped the check)."""
    import json

    head = Counted(4, 10)
    check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 2, 3]), "loss=x", "model=y", {}, 10, passed_in=tmp_path)
    path = tmp_path / "fit_check.json"
    inputs = json.loads(path.read_text())["inputs"]
    path.write_text({"garbage": "\x00{not json", "list": json.dumps([inputs, 10]),
                     "no_outputs": json.dumps({"inputs": inputs}),
                     "text_outputs": json.dumps({"inputs": inputs, "outputs": "10"})}[damage])
    assert check_fit(head, nn.CrossEntropyLoss(), labelled([0, 1, 2, 3]), "loss=x", "model=y", {}, 10,
                     passed_in=tmp_path) == 10
    assert head.calls == 2 and json.loads(path.read_text()) == {"inputs": inputs, "outputs": 10}
