"""TrainMetrics under a real Model.train, and in (simulated) dataset sink mode."""
import json
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, RunContext

from tests.common.callbacks import Params
from tests.common.models import TinyMLP, batches, loss_network
from trainkit import TrainingWrapper
from trainkit.callbacks import RunLog, TrainMetrics, optimizer_learning_rate

BATCH = 3


class LossSpy(Callback):
    """Every call's loss and overflow, as MindSpore's Model hands them to callbacks."""

    def __init__(self):
        super().__init__()
        self.losses, self.overflows, self.grad_norms = [], [], []

    def on_train_step_end(self, run_context):
        outputs = run_context.original_args().net_outputs
        self.losses.append(float(outputs[0].asnumpy()))
        self.overflows.append(bool(outputs[1].asnumpy()))
        self.grad_norms.append(float(outputs[3].asnumpy()))


def dataset_with_nan(count, nan_at):
    data = batches(count, BATCH, seed=3)
    xs = np.stack([x for x, _ in data])
    xs[nan_at, 0, 0] = np.nan
    return ms.dataset.NumpySlicesDataset({"x": xs, "y": np.stack([y for _, y in data])}, shuffle=False)


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("guard", [dict(loss_scale=256.0), dict(skip_nonfinite=True)], ids=["loss_scale", "guard"])
def test_records_under_model_train(mode, guard, tmp_path):
    """Skipped steps are counted with loss scaling and with the non-finite guard alone (scale 1)."""
    steps, epochs, every, nan_at = 8, 2, 3, 4  # the 5th batch of each epoch is NaN
    lrs = [0.1 - 0.005 * i for i in range(steps * epochs)]
    net = TinyMLP()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lrs, momentum=0.9)
    wrapper = TrainingWrapper(loss_network(net), optimizer, compute_grad_norm=True, **guard)
    spy = LossSpy()
    with RunLog(tmp_path) as log:
        metrics = TrainMetrics(log, samples_per_step=BATCH, log_every_n_steps=every)
        ms.train.Model(wrapper).train(epochs, dataset_with_nan(steps, nan_at), callbacks=[spy, metrics],
                                      dataset_sink_mode=False)
    records = read_records(tmp_path / "metrics.jsonl")

    # every 3 steps, and at the end of each epoch (8, 16) unless a record was just made there
    expected_steps = [3, 6, 8, 9, 12, 15, 16]
    assert [r["step"] for r in records] == expected_steps
    assert [r["epoch"] for r in records] == [1, 1, 1, 2, 2, 2, 2]
    nan_steps = {nan_at + 1, steps + nan_at + 1}  # 1-based global steps of the NaN batches
    assert [i + 1 for i, o in enumerate(spy.overflows) if o] == sorted(nan_steps)
    previous = 0
    for record in records:
        step = record["step"]
        skipped = sum(1 for s in nan_steps if s <= step)
        assert record["train/skipped_steps"] == skipped
        # the learning rate of the last applied step: skipped steps do not advance the schedule
        assert record["train/learning_rate"] == pytest.approx(lrs[step - skipped - 1], rel=1e-6)
        window = spy.losses[previous:step]
        if any(previous < s <= step for s in nan_steps):
            assert math.isnan(record["train/loss"])
        else:
            assert record["train/loss"] == pytest.approx(np.mean(window), rel=1e-6)
        assert record["train/loss_scale"] == guard.get("loss_scale", 1.0)
        last_norm = [g for g in spy.grad_norms[previous:step] if g != 0.0][-1]
        assert record["train/grad_norm"] == pytest.approx(last_norm, rel=1e-6, nan_ok=True)
        if step > 1:
            assert record["train/samples_per_second"] > 0
        previous = step
    assert metrics.skipped_steps == 2
    assert metrics.last["step"] == 16 and metrics.last["train/skipped_steps"] == 2
    assert metrics.current_loss == pytest.approx(spy.losses[-1])


def test_a_bare_loss_output_records_loss_and_learning_rate(graph_mode, tmp_path):
    net = TinyMLP()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    data = batches(4, BATCH, seed=4)
    dataset = ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in data]), "y": np.stack([y for _, y in data])}, shuffle=False)
    with RunLog(tmp_path, tensorboard=False) as log:
        metrics = TrainMetrics(log, samples_per_step=BATCH, log_every_n_steps=2)
        ms.train.Model(nn.TrainOneStepCell(loss_network(net), optimizer)).train(
            1, dataset, callbacks=[metrics], dataset_sink_mode=False)
    records = read_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        assert set(record) == {"step", "optimizer_step", "epoch", "time", "train/loss", "train/learning_rate",
                               "train/samples_per_second"}  # no overflow, scale or norm in the outputs
        assert record["train/learning_rate"] == pytest.approx(0.05)
    assert metrics.skipped_steps == 0


def test_learning_rate_callable_overrides_the_optimizer(tmp_path):
    metrics = TrainMetrics(None, samples_per_step=1, learning_rate=lambda: 0.25, log_every_n_steps=1)
    params = Params(cur_step_num=0, cur_epoch_num=1, net_outputs=Tensor(1.5, ms.float32))
    context = RunContext(params)
    metrics.on_train_begin(context)
    metrics.on_train_epoch_begin(context)
    params.cur_step_num = 1
    metrics.on_train_step_end(context)
    assert metrics.last == {"step": 1, "epoch": 1, "train/loss": 1.5, "train/learning_rate": 0.25}


def test_sink_mode_records_once_per_sink(monkeypatch, tmp_path):
    """As Model drives callbacks in sink mode (GPU/Ascend graph mode): one step end per sink of `sink_size`
    steps, ``cur_step_num`` advanced by the sink size, the sink's last outputs only."""
    sink_size, sinks_per_epoch, epochs, batch, sink_seconds = 5, 3, 2, 4, 2.0
    clock = [100.0]
    monkeypatch.setattr("trainkit.callbacks.train_metrics.time.perf_counter", lambda: clock[0])
    net = TinyMLP()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)
    train_network = TrainingWrapper(loss_network(net), optimizer)  # only its optimizer is read
    params = Params(cur_step_num=0, epoch_num=epochs, batch_num=sink_size, sink_size=sink_size,
                    dataset_sink_mode=True, train_network=train_network, optimizer=None)
    context = RunContext(params)
    overflow_sinks = {2, 4}  # sinks whose last step overflowed
    with RunLog(tmp_path, tensorboard=False) as log:
        metrics = TrainMetrics(log, samples_per_step=batch, log_every_n_steps=5)
        metrics.on_train_begin(context)
        sink = 0
        for epoch in range(1, epochs + 1):
            params.cur_epoch_num = epoch
            metrics.on_train_epoch_begin(context)
            for _ in range(sinks_per_epoch):
                sink += 1
                clock[0] += sink_seconds + (30.0 if sink == 1 else 0.0)  # the first sink compiles
                params.cur_step_num += sink_size
                params.net_outputs = (Tensor(float(sink), ms.float32), Tensor(sink in overflow_sinks),
                                      Tensor(1024.0, ms.float32), Tensor(0.5 * sink, ms.float32))
                metrics.on_train_step_end(context)
            clock[0] += 7.0  # evaluation between epochs is not training time
            metrics.on_train_epoch_end(context)
    records = read_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25, 30]
    assert [r["epoch"] for r in records] == [1, 1, 1, 2, 2, 2]
    assert [r["train/loss"] for r in records] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [r["train/grad_norm"] for r in records] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert [r["train/skipped_steps"] for r in records] == [0, 1, 1, 2, 2, 2]
    assert all(r["train/loss_scale"] == 1024.0 for r in records)
    # the first sink (compilation) has no throughput; then sink_size * batch samples per sink_seconds
    assert "train/samples_per_second" not in records[0]
    assert [r["train/samples_per_second"] for r in records[1:]] == [sink_size * batch / sink_seconds] * 5


def test_sink_mode_with_a_longer_log_interval(tmp_path):
    metrics = TrainMetrics(None, samples_per_step=2, log_every_n_steps=10)
    params = Params(cur_step_num=0, cur_epoch_num=1, train_network=None, optimizer=None)
    context = RunContext(params)
    metrics.on_train_begin(context)
    metrics.on_train_epoch_begin(context)
    steps = []
    for sink in range(1, 4):  # sinks of 4 steps: 4, 8, 12 -> the global step crosses 10 at 12
        params.cur_step_num = 4 * sink
        params.net_outputs = Tensor(float(sink), ms.float32)
        metrics.on_train_step_end(context)
        steps.append(metrics.last.get("step"))
    assert steps == [None, None, 12]
    assert metrics.last["train/loss"] == pytest.approx(2.0)  # mean of the three sinks' last losses


def test_bad_arguments():
    with pytest.raises(ValueError, match="log_every_n_steps"):
        TrainMetrics(None, samples_per_step=1, log_every_n_steps=0)
    with pytest.raises(ValueError, match="samples_per_step"):
        TrainMetrics(None, samples_per_step=0)


def test_learning_rate_of_a_schedule_and_of_grouped_parameters(mode):
    """The rate the last applied step used: schedule(global_step - 1), first group when grouped."""
    net = TinyMLP()
    decay_steps, max_lr = 10, 0.1
    groups = [{"params": [net.fc1.weight, net.fc1.bias], "lr": nn.CosineDecayLR(0.0, max_lr, decay_steps)},
              {"params": [net.fc2.weight, net.fc2.bias], "lr": 0.5}]
    optimizer = nn.Momentum(groups, learning_rate=0.2, momentum=0.9)
    wrapper = TrainingWrapper(loss_network(net), optimizer)
    assert optimizer_learning_rate(optimizer) == pytest.approx(max_lr)  # before any step: schedule(0)
    wrapper.set_train()
    for x, y in batches(4, BATCH, seed=8):
        wrapper(Tensor(x), Tensor(y))
    cosine = 0.5 * max_lr * (1 + math.cos(math.pi * 3 / decay_steps))  # the 4th step used schedule(3)
    assert optimizer_learning_rate(optimizer) == pytest.approx(cosine, rel=1e-5)
    plain = nn.SGD(net.trainable_params(), learning_rate=0.03)
    assert optimizer_learning_rate(plain) == pytest.approx(0.03)


def test_a_resumed_run_continues_the_global_step(graph_mode, tmp_path):
    """Model.train(initial_epoch=k) restarts cur_step_num at 0; the records go on from k epochs of steps."""
    steps = 4
    net = TinyMLP()
    wrapper = TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), learning_rate=0.01))
    data = batches(steps, BATCH, seed=5)
    dataset = ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in data]), "y": np.stack([y for _, y in data])}, shuffle=False)
    with RunLog(tmp_path, tensorboard=False) as log:
        metrics = TrainMetrics(log, samples_per_step=BATCH, log_every_n_steps=3)
        ms.train.Model(wrapper).train(3, dataset, callbacks=[metrics], dataset_sink_mode=False, initial_epoch=1)
    records = read_records(tmp_path / "metrics.jsonl")
    assert [(r["epoch"], r["step"]) for r in records] == [(2, 6), (2, 8), (3, 9), (3, 12)]


class CountsCalls(TrainingWrapper):
    """A subclass with a scalar of its own, logged through logged_scalars() alongside the running totals."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = ms.Parameter(Tensor(0, ms.int32), name="calls", requires_grad=False)

    def construct(self, *inputs):
        ms.ops.assign_add(self.calls, ms.ops.ones((), ms.int32))
        return super().construct(*inputs)

    def logged_scalars(self):
        return {"calls": self.calls}


@pytest.mark.parametrize("k", [1, 2])
def test_running_totals_on_the_device_record_the_same_curves(graph_mode, tmp_path, k):
    """metrics_on_device: the records hold the mean of every call's loss since the previous record, the skip count
    and the latest window's gradient norm, as the per-step outputs (seen by a spy) say."""
    steps, every, nan_at = 8, 3, 4
    net = TinyMLP()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    wrapper = CountsCalls(loss_network(net), optimizer, compute_grad_norm=True, loss_scale=64.0,
                          accumulation_steps=k, metrics_on_device=True)
    spy = LossSpy()
    with RunLog(tmp_path) as log:
        metrics = TrainMetrics(log, samples_per_step=BATCH, log_every_n_steps=every, scalars=wrapper.logged_scalars())
        ms.train.Model(wrapper).train(2, dataset_with_nan(steps, nan_at), callbacks=[spy, metrics],
                                      dataset_sink_mode=False)
    records = read_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [3, 6, 8, 9, 12, 15, 16]
    previous = 0
    for record in records:
        step = record["step"]
        window = spy.losses[previous:step]
        if any(math.isnan(loss) for loss in window):
            assert math.isnan(record["train/loss"])
        else:
            assert record["train/loss"] == pytest.approx(np.mean(window), rel=1e-5)
        assert record["train/skipped_steps"] == sum(spy.overflows[:step])
        finite_norms = [g for g in spy.grad_norms[:step] if g and np.isfinite(g)]
        assert record["train/grad_norm"] == pytest.approx(finite_norms[-1], rel=1e-6)  # a non-finite one: skipped
        assert record["train/loss_scale"] == 64.0
        assert record["train/calls"] == step
        previous = step
    assert metrics.skipped_steps == sum(spy.overflows) == 2
    assert metrics.current_loss == records[-1]["train/loss"]  # what Progress shows: the latest record's value


def test_running_totals_are_read_at_record_time_only(graph_mode):
    """With totals on the device no step's outputs are read: outputs that cannot be read do not matter."""

    class Unreadable:
        def __getattr__(self, name):
            raise AssertionError("a step's outputs were read")

    net = TinyMLP()
    wrapper = TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), learning_rate=0.05),
                              skip_nonfinite=True, metrics_on_device=True)
    metrics = TrainMetrics(None, samples_per_step=BATCH, log_every_n_steps=4)
    params = Params(cur_step_num=0, cur_epoch_num=1, train_network=wrapper, optimizer=None, net_outputs=Unreadable())
    context = RunContext(params)
    metrics.on_train_begin(context)
    metrics.on_train_epoch_begin(context)
    wrapper.set_train()
    losses = []
    for step, (x, y) in enumerate(batches(6, BATCH, seed=9), start=1):
        losses.append(float(wrapper(Tensor(x), Tensor(y))[0].asnumpy()))
        params.cur_step_num = step
        metrics.on_train_step_end(context)
    assert metrics.last["step"] == 4 and metrics.last["train/loss"] == pytest.approx(np.mean(losses[:4]), rel=1e-6)
    metrics.on_train_epoch_end(context)
    assert metrics.last["step"] == 6 and metrics.last["train/loss"] == pytest.approx(np.mean(losses[4:]), rel=1e-6)
