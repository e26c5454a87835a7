"""Callbacks for `mindspore.train.Model`: progress, metrics, evaluation, checkpoints.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import ``distributed``, the
run directory, the parts (``step``, ``models``, ``data``, ``parts``), ``kernels`` and the foundation (``checks``,
``process``, ``errors``); never the app, the bridge or the tools.
"""
from trainkit.callbacks.best_checkpoint import BestCheckpoint
from trainkit.callbacks.evaluation import Evaluation, ema_weights, swap_in_ema
from trainkit.callbacks.nonfinite_stop import NonFiniteStop
from trainkit.callbacks.progress import Progress
from trainkit.callbacks.run_log import RunLog
from trainkit.callbacks.train_metrics import TrainMetrics, optimizer_learning_rate, step_outputs

__all__ = ["BestCheckpoint", "Evaluation", "NonFiniteStop", "Progress", "RunLog", "TrainMetrics", "ema_weights",
           "swap_in_ema", "optimizer_learning_rate", "step_outputs"]
