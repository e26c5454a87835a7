"""Evaluation: metrics equal a NumPy forward pass, with the live and with the EMA weights; the swap leaves
no trace on training."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback

from tests.common.callbacks import Snapshots
from tests.common.models import TinyMLP, batches, loss_network
from trainkit import ExponentialMovingAverage, TrainingWrapper
from trainkit.callbacks import Evaluation, RunLog, ema_weights
from trainkit.step.ema import ema_source_parameters

EVAL_BATCH = 5


def numpy_metrics(weights, x, y):
    """Accuracy and mean per-batch cross-entropy of Dense -> Tanh -> Dense, in float64."""
    w1, b1, w2, b2 = (weights[k].astype(np.float64) for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    logits = np.tanh(x.astype(np.float64) @ w1.T + b1) @ w2.T + b2
    log_probs = logits - logits.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    batch_losses = [-np.mean(log_probs[i:i + EVAL_BATCH][np.arange(len(y[i:i + EVAL_BATCH])), y[i:i + EVAL_BATCH]])
                    for i in range(0, len(y), EVAL_BATCH)]
    return float(np.mean(logits.argmax(1) == y)), float(np.mean(batch_losses))


class StopAfter(Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_train_epoch_end(self, run_context):
        if run_context.original_args().cur_epoch_num == self.epoch:
            run_context.request_stop()


def eval_data(seed=7, count=4):
    data = batches(count, EVAL_BATCH, seed=seed)
    return np.concatenate([x for x, _ in data]), np.concatenate([y for _, y in data])


def make_model(ema_decay=0.5):
    net = TinyMLP()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.05)
    wrapper = TrainingWrapper(loss_network(net), optimizer, ema_decay=ema_decay, loss_scale=64.0)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.train.Model(wrapper, eval_network=nn.WithEvalCell(net, loss_fn), eval_indexes=[0, 1, 2],
                           metrics={"accuracy", "loss"})
    return wrapper, model


def train_dataset():
    data = batches(4, 4, seed=1)
    return ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in data]), "y": np.stack([y for _, y in data])}, shuffle=False)


def eval_dataset(x, y):
    return ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(EVAL_BATCH)


def test_live_and_ema_metrics_equal_numpy_and_leave_no_trace(mode, tmp_path):
    x, y = eval_data()
    wrapper, model = make_model()
    before, after = Snapshots(), Snapshots()
    with RunLog(tmp_path) as log:
        evaluation = Evaluation(model, eval_dataset(x, y), log, interval=2, ema=wrapper.ema)
        model.train(3, train_dataset(), callbacks=[before, evaluation, after], dataset_sink_mode=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    assert [r["epoch"] for r in evaluation.history] == [2, 3]  # every 2nd epoch and the last
    assert [r["step"] for r in evaluation.history] == [8, 12]
    assert evaluation.latest is evaluation.history[-1]
    assert len(records) == len(evaluation.history) == 2  # zip below compares every record
    for result, record in zip(evaluation.history, records):
        weights = before.by_epoch[result["epoch"]]
        shadows = {name: weights["ema." + name] for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
        accuracy, loss = numpy_metrics(weights, x, y)
        ema_accuracy, ema_loss = numpy_metrics(shadows, x, y)
        assert result["eval/accuracy"] == pytest.approx(accuracy)
        assert result["eval/loss"] == pytest.approx(loss, rel=1e-5)
        assert result["eval_ema/accuracy"] == pytest.approx(ema_accuracy)
        assert result["eval_ema/loss"] == pytest.approx(ema_loss, rel=1e-5)
        assert abs(ema_loss - loss) > 1e-3  # the two weight sets really differ
        assert record == {"step": result["step"], "optimizer_step": result["step"], "epoch": result["epoch"],
                          "time": record["time"],
                          **{k: v for k, v in result.items() if k.startswith("eval")}}
        # live weights, optimizer moments, EMA shadows, counters: bit-identical after the evaluation
        assert before.by_epoch[result["epoch"]].keys() == after.by_epoch[result["epoch"]].keys()
        for name, value in before.by_epoch[result["epoch"]].items():
            np.testing.assert_array_equal(after.by_epoch[result["epoch"]][name], value, err_msg=name)
    assert evaluation.metric_names == ["eval/accuracy", "eval/loss", "eval_ema/accuracy", "eval_ema/loss"]


def test_training_after_an_ema_evaluation_equals_training_without(graph_mode):
    x, y = eval_data()
    final = []
    for evaluate in (True, False):
        wrapper, model = make_model()
        callbacks = [Evaluation(model, eval_dataset(x, y), None, ema=wrapper.ema)] if evaluate else []
        model.train(3, train_dataset(), callbacks=callbacks, dataset_sink_mode=False)
        final.append({p.name: p.asnumpy() for p in wrapper.get_parameters()})
        if evaluate:
            assert len(callbacks[0].history) == 3
    assert final[0].keys() == final[1].keys()
    for name in final[0]:
        np.testing.assert_array_equal(final[0][name], final[1][name], err_msg=name)


def test_a_stopped_resumed_run_is_evaluated_at_train_end(graph_mode):
    x, y = eval_data(count=2)
    wrapper, model = make_model(ema_decay=None)
    evaluation = Evaluation(model, eval_dataset(x, y), None, interval=5)
    model.train(10, train_dataset(), callbacks=[StopAfter(3), evaluation], dataset_sink_mode=False, initial_epoch=1)
    # epochs 2 and 3 ran (4 steps each, after the 4 of epoch 1): epoch 3 is evaluated when training ends
    assert [(r["epoch"], r["step"]) for r in evaluation.history] == [(3, 12)]
    assert set(evaluation.latest) == {"epoch", "step", "eval/accuracy", "eval/loss"}
    assert evaluation.metric_names == ["eval/accuracy", "eval/loss"]


def test_ema_weights_swap_in_and_back_even_on_error(mode):
    net = TinyMLP(batch_norm=True)
    sources = ema_source_parameters(net)
    assert {"bn.moving_mean", "bn.moving_variance"} <= {p.name for p in sources}  # statistics swap too
    ema = ExponentialMovingAverage(sources, 0.9)
    for shadow in ema.shadows:
        shadow.set_data(Tensor(np.full(shadow.shape, 0.25, np.float32)))
    live = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    with pytest.raises(RuntimeError, match="inside"), ema_weights(ema):
        for p in sources:
            np.testing.assert_array_equal(p.asnumpy(), np.full(p.shape, 0.25, np.float32))
        raise RuntimeError("inside")
    for p in net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), live[p.name])
    for shadow in ema.shadows:
        np.testing.assert_array_equal(shadow.asnumpy(), np.full(shadow.shape, 0.25, np.float32))


def test_bad_arguments():
    _, model = make_model()
    with pytest.raises(ValueError, match="interval"):
        Evaluation(model, None, interval=0)
    with pytest.raises(TypeError, match="ExponentialMovingAverage"):
        Evaluation(model, None, ema={"fc1.weight": 1})
