"""What MindSpore's callback parameters say about a run: its global step across a resume, the last epoch of a
``Model.train`` call, whether a stop ends an epoch early, and the optimizer's learning rate.

A leaf of ``trainkit.callbacks``: the public :class:`trainkit.Callback` (``base``) and trainkit's own callbacks,
which derive from it, read the run's counters through these.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
from mindspore import Parameter, Tensor, nn
from mindspore import dtype as mstype


def _scalar(value: Any) -> float:
    if isinstance(value, Tensor) and value.size == 1:
        return float(value.item())  # about half the cost of asnumpy() for a one-element Tensor
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    return float(np.asarray(value).reshape(-1)[0])


def find_optimizer(cb_params: Any) -> Optional[nn.Optimizer]:
    """The optimizer the train network steps: ``train_network.optimizer`` (TrainingWrapper, TrainOneStepCell)
    or the one given to ``Model``."""
    network = cb_params.get("train_network") if hasattr(cb_params, "get") else None
    optimizer = getattr(network, "optimizer", None)
    if isinstance(optimizer, nn.Optimizer):
        return optimizer
    optimizer = cb_params.get("optimizer") if hasattr(cb_params, "get") else None
    return optimizer if isinstance(optimizer, nn.Optimizer) else None


def optimizer_learning_rate(optimizer: nn.Optimizer) -> float:
    """The learning rate of the optimizer's most recent step (of its first parameter group if grouped).

    A schedule (``LearningRateSchedule`` or a list of rates) is indexed by ``global_step``, which the optimizer
    increments after reading it, so the step just taken used ``schedule(global_step - 1)``; before any step this
    is ``schedule(0)``, the rate the first step will use.
    """
    rate = optimizer.learning_rate
    if optimizer.is_group_lr:
        rate = rate[0]
    if not optimizer.dynamic_lr:
        return _scalar(rate)
    step = max(int(_scalar(optimizer.global_step)) - 1, 0)
    table = getattr(rate, "learning_rate", None)  # a list of rates: MindSpore's _IteratorLearningRate holds it
    if isinstance(table, Parameter) and table.ndim == 1:
        # Indexed on the host: running the schedule's Gather as an op costs milliseconds per record on CPU.
        values = table.asnumpy()
        return float(values[min(step, len(values) - 1)])
    return _scalar(rate(Tensor(np.array([step], np.int32), mstype.int32)))


def last_epoch(params: Any) -> int:
    """The last epoch of the ``Model.train`` call whose callback parameters are `params` (read at an epoch's begin):
    its epochs run from ``initial_epoch + 1`` to ``initial_epoch + epoch_num``."""
    return int(params.cur_epoch_num) - 1 + int(params.epoch_num)


class GlobalStep:
    """The run's global step from Model's callback parameters, continuing across a resume.

    ``Model.train(epoch, ..., initial_epoch=k)`` starts ``cur_epoch_num`` at k + 1 but ``cur_step_num`` at 0, so
    a resumed run's records would restart at step 1. The first time it is read in a ``train`` call (at the first
    epoch begin) with ``cur_step_num == 0`` and ``cur_epoch_num > 1``, the ``(cur_epoch_num - 1) * batch_num``
    steps already done are added from then on (``batch_num``: steps per epoch, or per sink in sink mode).
    """

    def __init__(self):
        self.offset: Optional[int] = None

    def reset(self) -> None:
        self.offset = None

    def __call__(self, params: Any) -> int:
        step = int(params.cur_step_num)
        if self.offset is None:
            epoch = int(params.get("cur_epoch_num") or 1)
            batch_num = int(params.get("batch_num") or 0)
            self.offset = (epoch - 1) * batch_num if step == 0 and epoch > 1 else 0
        return self.offset + step


def stopped_mid_epoch(run_context) -> bool:
    """Whether Model is ending an epoch early because a callback asked it to stop after a step."""
    params = run_context.original_args()
    return run_context.get_stop_requested() and int(params.cur_step_num) % int(params.batch_num) != 0
