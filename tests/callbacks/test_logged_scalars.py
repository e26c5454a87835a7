"""TrainMetrics records a wrapper's own scalars (``TrainingWrapper.logged_scalars()``) at records only."""
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest

from trainkit.callbacks import TrainMetrics
from trainkit.callbacks.train_metrics import checked_scalars


class CountedReads(ms.Tensor):
    """A one-element Tensor that counts how often its value is read to the host."""

    reads = 0

    def item(self):
        CountedReads.reads += 1
        return super().item()

    def asnumpy(self):
        CountedReads.reads += 1
        return super().asnumpy()


class Context:
    def __init__(self, params):
        self.params = params

    def original_args(self):
        return self.params


def test_scalars_are_read_only_when_a_record_is_written():
    counter = CountedReads(np.array(0, np.int32))
    CountedReads.reads = 0
    callback = TrainMetrics(None, samples_per_step=1, log_every_n_steps=5, scalars={"counted": counter})
    params = SimpleNamespace(cur_step_num=0, cur_epoch_num=1, batch_num=10, net_outputs=ms.Tensor(1.0),
                             get=lambda key, default=None: getattr(params, key, default), train_network=None)
    callback.on_train_begin(Context(params))
    callback.on_train_epoch_begin(Context(params))
    recorded = []
    for step in range(1, 11):
        params.cur_step_num = step
        callback.on_train_step_end(Context(params))
        if callback.last.get("step") == step:
            recorded.append((step, callback.last["train/counted"]))
    assert recorded == [(5, 0.0), (10, 0.0)]
    assert CountedReads.reads == 2  # one read per record, none per step


@pytest.mark.parametrize("scalars, message", [
    ({"loss": ms.Tensor(0.0)}, "logged scalar name 'loss' is not valid"),
    ({"pair": ms.Tensor(np.zeros(2, np.float32))}, "logged scalar 'pair' must be a one-element Tensor"),
    ({"count": 3}, "logged scalar 'count' must be a one-element Tensor"),
])
def test_bad_scalars_are_refused_naming_them(scalars, message):
    with pytest.raises((TypeError, ValueError), match=message):
        checked_scalars(scalars)
