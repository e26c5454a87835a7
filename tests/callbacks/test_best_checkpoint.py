"""BestCheckpoint: saves on improvement only, atomically, a file mindspore.load_checkpoint reads back."""
import binascii
import json
import logging
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import RunContext

from tests.common.callbacks import Params, Snapshots
from tests.common.models import TinyMLP, batches, loss_network
from trainkit import TrainingWrapper
from trainkit.callbacks import BestCheckpoint, Evaluation


def make_model(ema_decay=None):
    net = TinyMLP()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    wrapper = TrainingWrapper(loss_network(net), optimizer, ema_decay=ema_decay)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.train.Model(wrapper, eval_network=nn.WithEvalCell(net, loss_fn), eval_indexes=[0, 1, 2],
                           metrics={"accuracy", "loss"})
    return net, wrapper, model


def stored_crc(path):
    """The CRC32 MindSpore's trailer holds (b"crc_num" + 10 bytes), checked against the bytes before it."""
    content = path.read_bytes()
    assert content[-17:-10] == b"crc_num"
    stored = int.from_bytes(content[-10:], "big")
    assert stored == binascii.crc32(content[:-17])
    return stored


def files_in(directory):
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("mode_name, values, saved_at", [
    ("max", [0.5, 0.4, 0.7, 0.7, math.nan, 0.71], [1, 3, 6]),
    ("min", [0.5, 0.6, 0.2, math.nan, 0.2, 0.1], [1, 3, 6]),
])
def test_saves_only_on_improvement(tmp_path, mode_name, values, saved_at):
    net, wrapper, model = make_model()
    evaluation = Evaluation(model, None)
    metric = "eval/accuracy" if mode_name == "max" else "eval/loss"
    best = BestCheckpoint(evaluation, tmp_path / "ckpt", metric=metric, mode=mode_name)
    context = RunContext(Params(train_network=wrapper, list_callback=[evaluation, best]))
    best.on_train_begin(context)
    saves = []
    for epoch, value in enumerate(values, start=1):
        # mark the weights with the epoch, so the file tells which epoch it holds
        net.fc2.bias.set_data(Tensor(np.full(3, epoch, np.float32)))
        evaluation.history.append({"epoch": epoch, "step": 10 * epoch, metric: value})
        best.on_train_epoch_end(context)
        saves.append(int(ms.load_checkpoint(str(best.path))["fc2.bias"].asnumpy()[0]))
    expected = [max(s for s in saved_at if s <= epoch) for epoch in range(1, len(values) + 1)]
    assert saves == expected
    assert best.saves == len(saved_at)
    assert best.best == values[saved_at[-1] - 1] and best.best_epoch == saved_at[-1]
    assert json.loads((tmp_path / "ckpt" / "best.json").read_text()) == {
        "metric": metric, "mode": mode_name, "value": values[saved_at[-1] - 1], "epoch": saved_at[-1],
        "step": 10 * saved_at[-1], "checkpoint": "best.ckpt", "crc32": stored_crc(best.path)}
    assert files_in(tmp_path / "ckpt") == ["best.ckpt", "best.json"]  # no temporary file left

    # a resumed run starts from the recorded best and does not overwrite it with a worse result
    resumed = BestCheckpoint(evaluation, tmp_path / "ckpt", metric=metric, mode=mode_name)
    assert resumed.best == best.best
    worse = values[saved_at[-1] - 1] + (-0.01 if mode_name == "max" else 0.01)
    assert not resumed.update({"epoch": 99, "step": 990, metric: worse}, wrapper)


def test_under_model_train_keeps_the_best_epochs_state(graph_mode, tmp_path):
    net, wrapper, model = make_model(ema_decay=0.5)
    data = batches(4, 4, seed=1)
    train = ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in data]), "y": np.stack([y for _, y in data])}, shuffle=False)
    eval_x, eval_y = (np.concatenate(a) for a in zip(*batches(3, 5, seed=9)))
    evaluation = Evaluation(model, ms.dataset.NumpySlicesDataset({"x": eval_x, "y": eval_y}, shuffle=False).batch(5),
                            None, ema=wrapper.ema)
    best = BestCheckpoint(evaluation, tmp_path, metric="eval_ema/loss", mode="min")
    snapshots = Snapshots()
    model.train(4, train, callbacks=[evaluation, best, snapshots], dataset_sink_mode=False)

    losses = [r["eval_ema/loss"] for r in evaluation.history]
    best_epoch = int(np.argmin(losses)) + 1
    assert best.best_epoch == best_epoch and best.best == min(losses)
    assert best.saves == sum(1 for i, v in enumerate(losses) if v < min(losses[:i], default=math.inf))
    saved = ms.load_checkpoint(str(tmp_path / "best.ckpt"))
    expected = snapshots.by_epoch[best_epoch]
    # what it was saved for, and the marker of a checksummed file, beside the state
    described = {name: saved.pop(name) for name in ("best_metric", "best_value", "best_step", "trainkit_crc32")}
    assert described["best_metric"] == "eval_ema/loss"
    assert float(described["best_value"].asnumpy()) == pytest.approx(min(losses))
    assert int(described["best_step"].asnumpy()) == evaluation.history[best_epoch - 1]["step"]
    assert set(saved) == set(expected)  # weights, optimizer moments, EMA shadows, counters
    assert {"moments.fc1.weight", "ema.fc1.weight", "global_step", "ema_num_updates"} <= set(saved)
    for name, value in expected.items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value, err_msg=name)
    assert files_in(tmp_path) == ["best.ckpt", "best.json"]


def test_unknown_metric_names_the_valid_ones(tmp_path):
    _, wrapper, model = make_model(ema_decay=0.9)
    evaluation = Evaluation(model, None, ema=wrapper.ema)
    with pytest.raises(ValueError) as error:
        BestCheckpoint(evaluation, tmp_path, metric="eval/acc")
    message = str(error.value)
    assert "'eval/acc'" in message
    for name in ("eval/accuracy", "eval/loss", "eval_ema/accuracy", "eval_ema/loss"):
        assert name in message
    with pytest.raises(ValueError, match="'max' or 'min'"):
        BestCheckpoint(evaluation, tmp_path, metric="eval/loss", mode="lowest")
    assert list(tmp_path.iterdir()) == []


def test_must_come_after_its_evaluation(tmp_path):
    _, wrapper, model = make_model()
    evaluation = Evaluation(model, None)
    best = BestCheckpoint(evaluation, tmp_path)
    with pytest.raises(ValueError, match="after its Evaluation"):
        best.on_train_begin(RunContext(Params(train_network=wrapper, list_callback=[best, evaluation])))


def test_a_best_json_that_does_not_describe_best_ckpt_is_not_trusted(tmp_path, caplog):
    """A crash between the two replacements (or an edit) leaves a best.json of another best.ckpt: the best so far is
    then best.ckpt's own value; a corrupt best.ckpt leaves none (the next evaluation replaces it)."""
    net, wrapper, model = make_model()
    evaluation = Evaluation(model, None)
    best = BestCheckpoint(evaluation, tmp_path, metric="eval/accuracy", mode="max")
    best.update({"epoch": 1, "step": 10, "eval/accuracy": 0.5}, wrapper)
    stale = (tmp_path / "best.json").read_text()
    best.update({"epoch": 2, "step": 20, "eval/accuracy": 0.8}, wrapper)
    (tmp_path / "best.json").write_text(stale)  # best.ckpt of epoch 2, best.json of epoch 1
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        resumed = BestCheckpoint(evaluation, tmp_path, metric="eval/accuracy", mode="max")
    assert resumed.best == pytest.approx(0.8)  # not 0.5: a 0.6 must not replace the 0.8 checkpoint
    assert not resumed.update({"epoch": 3, "step": 30, "eval/accuracy": 0.6}, wrapper)
    assert "does not describe" in caplog.text and "best.ckpt" in caplog.text

    content = bytearray((tmp_path / "best.ckpt").read_bytes())
    content[len(content) // 2:len(content) // 2 + 64] = b"\xff" * 64
    (tmp_path / "best.ckpt").write_bytes(bytes(content))
    (tmp_path / "best.json").write_text(stale)
    assert BestCheckpoint(evaluation, tmp_path, metric="eval/accuracy", mode="max").best is None


@pytest.mark.parametrize("edit", [{"value": 0.99}, {"step": 20}, {"metric": "eval/loss"}])
def test_a_best_json_edited_with_its_crc32_kept_is_not_trusted(edit, tmp_path, caplog):
    """The CRC32 ties best.json to best.ckpt's bytes, not its value: an edited value (kept CRC32) would stop every
    later evaluation from replacing best.ckpt, silently. Mutation caught: trusting best.json when its crc32
    matches (no comparison with best.ckpt's own best_value/best_step/best_metric) kept 0.99, without a warning."""
    net, wrapper, model = make_model()
    evaluation = Evaluation(model, None)
    best = BestCheckpoint(evaluation, tmp_path, metric="eval/accuracy", mode="max")
    best.update({"epoch": 1, "step": 10, "eval/accuracy": 0.5}, wrapper)
    info = json.loads((tmp_path / "best.json").read_text())
    assert info["crc32"] == stored_crc(best.path)
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        assert BestCheckpoint(evaluation, tmp_path, metric="eval/accuracy", mode="max").best == 0.5  # intact
    assert "edited" not in caplog.text
    (tmp_path / "best.json").write_text(json.dumps({**info, **edit}))  # the crc32 kept
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        resumed = BestCheckpoint(evaluation, tmp_path, metric="eval/accuracy", mode="max")
    assert resumed.best == pytest.approx(0.5)  # best.ckpt's own, float32
    assert "best.json edited?" in caplog.text and "was saved for eval/accuracy 0.5 at step 10" in caplog.text
    assert resumed.update({"epoch": 2, "step": 20, "eval/accuracy": 0.6}, wrapper)  # a better one replaces it


def test_its_best_so_far_is_a_stateful_part_taken_back_where_its_best_ckpt_is(tmp_path):
    """state_dict() gives the best so far; load_state_dict() takes it back when best.ckpt is in the folder (the
    continuation compares with the best the checkpoint's run had at its step, as the uninterrupted run did, not with
    best.json's later one), not where no best.ckpt is (a new run directory: its first evaluation writes one), and not
    for another metric (best.json's is kept). Mutation caught: a load_state_dict that takes nothing back."""
    _, wrapper, model = make_model()
    evaluation = Evaluation(model, None)
    first = BestCheckpoint(evaluation, tmp_path / "a", metric="eval/accuracy", mode="max")
    assert first.update({"epoch": 4, "step": 40, "eval/accuracy": 0.8}, wrapper)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint keeps it
    assert state == {"metric": "eval/accuracy", "mode": "max", "best": 0.8, "best_epoch": 4, "best_step": 40}

    at_epoch_2 = {**state, "best": 0.6, "best_epoch": 2, "best_step": 20}  # an older checkpoint's
    resumed = BestCheckpoint(evaluation, tmp_path / "a", metric="eval/accuracy", mode="max")
    assert resumed.best == 0.8  # best.json's, until the registry gives the checkpoint's
    resumed.load_state_dict(at_epoch_2)
    assert (resumed.best, resumed.best_epoch, resumed.best_step) == (0.6, 2, 20)
    assert resumed.update({"epoch": 3, "step": 30, "eval/accuracy": 0.7}, wrapper)  # 0.7 > 0.6, as uninterrupted

    elsewhere = BestCheckpoint(evaluation, tmp_path / "b", metric="eval/accuracy", mode="max")
    elsewhere.load_state_dict(state)
    assert elsewhere.best is None and not (tmp_path / "b").exists()

    other_metric = BestCheckpoint(evaluation, tmp_path / "a", metric="eval/loss", mode="min")
    other_metric.load_state_dict(state)
    assert other_metric.best is None  # best.json follows eval/accuracy: no best so far for eval/loss
