"""Progress: a live line on a terminal, log lines otherwise; throughput and ETA from the step times."""
import io
import logging

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from mindspore.train import RunContext

from tests.common.callbacks import Params
from tests.common.models import TinyMLP, batches, loss_network
from trainkit import TrainingWrapper
from trainkit.callbacks import Progress, TrainMetrics
from trainkit.callbacks.progress import format_duration


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def drive(progress, epochs, steps_per_epoch, step_seconds, first_step_seconds, clock, losses=None):
    """Call the hooks as Model.train does, advancing a fake clock by each step's time."""
    params = Params(cur_step_num=0, cur_epoch_num=0, net_outputs=None)
    context = RunContext(params)
    progress.on_train_begin(context)
    lines = []
    for epoch in range(1, epochs + 1):
        params.cur_epoch_num = epoch
        progress.on_train_epoch_begin(context)
        for _ in range(steps_per_epoch):
            clock[0] += first_step_seconds if params.cur_step_num == 0 else step_seconds
            params.cur_step_num += 1
            loss = 1.0 / params.cur_step_num if losses is None else losses[params.cur_step_num - 1]
            params.net_outputs = (Tensor(loss, ms.float32), Tensor(False))
            progress.on_train_step_end(context)
            lines.append(progress.status_line(params.cur_step_num))
        progress.on_train_epoch_end(context)
    progress.on_train_end(context)
    return lines


def test_format_duration():
    assert format_duration(3723.4) == "1:02:03"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(None) == "?"


def test_terminal_line_has_loss_throughput_and_eta(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("trainkit.callbacks.progress.time.perf_counter", lambda: clock[0])
    stream = FakeTerminal()
    epochs, steps, batch, step_seconds = 2, 10, 32, 0.5
    progress = Progress(epochs, steps, batch, stream=stream, refresh_seconds=0.0, smoothing=1.0)
    assert progress.is_terminal
    lines = drive(progress, epochs, steps, step_seconds, first_step_seconds=20.25, clock=clock)

    # the first step compiles: no step time yet, so no throughput and an unknown ETA
    assert lines[0] == "epoch 1/2  step 1/10  loss 1.0000  ETA ?"
    # after step 4 of epoch 1: 6 + 10 steps left at 0.5 s; 32 samples per 0.5 s
    assert lines[3] == "epoch 1/2  step 4/10  loss 0.2500  64 samples/s  ETA 0:00:08"
    assert lines[12] == "epoch 2/2  step 3/10  loss 0.0769  64 samples/s  ETA 0:00:04"
    out = stream.getvalue()
    assert out.startswith("\r" + lines[0])
    assert out.count("\n") == epochs  # one finished line per epoch, redrawn with \r in between
    first_epoch, second_epoch = out.split("\n")[:2]
    assert first_epoch.count("\r") == steps + 1  # every step, then the epoch summary
    assert first_epoch.endswith("ETA 0:00:05  epoch time 0:00:25")  # 20.25 s compiling + 9 x 0.5 s
    assert second_epoch.rstrip().endswith("ETA 0:00:00  epoch time 0:00:05")


def test_smoothed_step_time_excludes_the_first_step(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("trainkit.callbacks.progress.time.perf_counter", lambda: clock[0])
    progress = Progress(1, 5, 8, stream=io.StringIO(), smoothing=0.5)
    drive(progress, 1, 5, step_seconds=1.0, first_step_seconds=100.0, clock=clock)
    assert progress.step_time == 1.0  # the 100 s compilation never enters the average


def test_log_lines_when_not_a_terminal(monkeypatch, caplog):
    clock = [0.0]
    monkeypatch.setattr("trainkit.callbacks.progress.time.perf_counter", lambda: clock[0])
    stream = io.StringIO()
    progress = Progress(2, 6, 16, stream=stream, every_n_steps=4)
    assert not progress.is_terminal
    with caplog.at_level(logging.INFO, logger="trainkit"):
        drive(progress, 2, 6, step_seconds=0.25, first_step_seconds=0.25, clock=clock)
    messages = [r.getMessage() for r in caplog.records if r.name == "trainkit"]
    assert stream.getvalue() == ""
    assert messages[0].startswith("epoch 1/2  step 4/6  loss 0.2500  64 samples/s  ETA ")
    assert messages[1] == "epoch 1/2 done in 1.5 s: 6 steps, loss 0.1667, 64 samples/s"
    assert messages[2].startswith("epoch 2/2  step 2/6  loss 0.1250")  # global step 8
    assert messages[3].startswith("epoch 2/2  step 6/6  loss 0.0833")  # global step 12
    assert messages[4] == "epoch 2/2 done in 1.5 s: 6 steps, loss 0.0833, 64 samples/s"
    assert len(messages) == 5


def test_under_model_train_with_train_metrics(graph_mode, caplog):
    net = TinyMLP()
    optimizer = ms.nn.SGD(net.trainable_params(), learning_rate=0.1)
    wrapper = TrainingWrapper(loss_network(net), optimizer, loss_scale=16.0)
    data = batches(5, 4, seed=6)
    dataset = ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in data]), "y": np.stack([y for _, y in data])}, shuffle=False)
    metrics = TrainMetrics(None, samples_per_step=4, log_every_n_steps=5)
    terminal = FakeTerminal()
    progress = Progress(2, 5, 4, stream=terminal, refresh_seconds=0.0, train_metrics=metrics)
    logged = Progress(2, 5, 4, stream=io.StringIO(), every_n_steps=5, train_metrics=metrics)
    with caplog.at_level(logging.INFO, logger="trainkit"):
        ms.train.Model(wrapper).train(2, dataset, callbacks=[metrics, progress, logged], dataset_sink_mode=False)
    lines = terminal.getvalue().split("\n")
    assert len(lines) == 3 and lines[2] == ""
    assert "epoch 2/2  step 5/5  loss " in lines[1] and "samples/s  ETA 0:00:00  epoch time" in lines[1]
    assert f"loss {metrics.current_loss:.4f}" in lines[1]
    messages = [r.getMessage() for r in caplog.records if r.name == "trainkit"]
    assert len(messages) == 4 and "done in" in messages[1] and "done in" in messages[3]


def test_bad_arguments():
    with pytest.raises(ValueError, match="every_n_steps"):
        Progress(1, 1, 1, every_n_steps=0)
    with pytest.raises(ValueError, match="smoothing"):
        Progress(1, 1, 1, smoothing=0.0)
