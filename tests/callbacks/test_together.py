"""All callbacks in the order the app wires them, under one Model.train."""
import io
import json

import mindspore as ms
import numpy as np
from mindspore import amp, nn

from tests.common.models import TinyMLP, batches, loss_network
from tests.common.tensorboard_events import read_scalars
from trainkit import TrainingWrapper
from trainkit.callbacks import BestCheckpoint, Evaluation, Progress, RunLog, TrainMetrics


def test_the_app_wiring(mode, tmp_path):
    epochs, steps, batch = 3, 6, 4
    net = TinyMLP()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.02)
    wrapper = TrainingWrapper(loss_network(net), optimizer, loss_scale=amp.DynamicLossScaler(2.0 ** 8, 2, 4),
                              max_grad_norm=1.0, accumulation_steps=2, ema_decay=0.8)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.train.Model(wrapper, eval_network=nn.WithEvalCell(net, loss_fn), eval_indexes=[0, 1, 2],
                           metrics={"accuracy", "loss"})
    train = batches(steps, batch, seed=2)
    train_set = ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in train]), "y": np.stack([y for _, y in train])}, shuffle=False)
    eval_x, eval_y = (np.concatenate(a) for a in zip(*batches(2, 6, seed=3)))
    eval_set = ms.dataset.NumpySlicesDataset({"x": eval_x, "y": eval_y}, shuffle=False).batch(6)

    with RunLog(tmp_path) as log:
        metrics = TrainMetrics(log, samples_per_step=batch, log_every_n_steps=4)
        progress = Progress(epochs, steps, batch, stream=io.StringIO(), every_n_steps=4, train_metrics=metrics)
        evaluation = Evaluation(model, eval_set, log, interval=1, ema=wrapper.ema)
        best = BestCheckpoint(evaluation, tmp_path / "checkpoints", metric="eval_ema/accuracy")
        model.train(epochs, train_set, callbacks=[metrics, progress, evaluation, best], dataset_sink_mode=True)

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "train/loss" in r]
    eval_records = [r for r in records if "eval/accuracy" in r]
    # on CPU, Model trains without sinking even when asked to: one step-end per step
    assert [r["step"] for r in train_records] == [4, 6, 8, 12, 16, 18]
    assert [(r["epoch"], r["step"]) for r in eval_records] == [(1, 6), (2, 12), (3, 18)]
    assert all({"train/learning_rate", "train/loss_scale", "train/grad_norm", "train/skipped_steps"} <= set(r)
               for r in train_records)
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["eval_ema/loss"]] == [6, 12, 18]
    assert [step for step, _ in scalars["train/loss"]] == [4, 6, 8, 12, 16, 18]
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file()
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text())["epoch"] == best.best_epoch
    assert best.best == max(r["eval_ema/accuracy"] for r in eval_records)
