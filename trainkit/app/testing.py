"""``trainer.test``: a number nobody tuned on -- ``best.ckpt`` (and its EMA weights) on the data's held-out test set.

The validation set (``eval_dataset()``) chose the best checkpoint and early stopping, so its figure is biased
upward; a data module that offers ``test_dataset()`` holds out a third set, evaluated once, at the end, with the
weights of ``best.ckpt``. The results are ``test/<metric>`` (``test_ema/<metric>`` with EMA weights): recorded in
``metrics.jsonl`` and TensorBoard at the run's last step and returned in the final metrics as ``test_<metric>``
(``test_ema_<metric>``).
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Dict, Optional

import mindspore as ms
from mindspore.train import Model
from omegaconf import DictConfig

from trainkit.callbacks.evaluation import _prefixed, ema_weights
from trainkit.checks import choice
from trainkit.errors import ConfigError
from trainkit.step.in_place import assign_in_place
from trainkit.step.rare_shapes import OpByOpForNewShapes
from trainkit.step.wrapper import TrainingWrapper

log = logging.getLogger("trainkit")


def has_test_set(data: Any) -> bool:
    """Whether a data module offers a held-out test set: a ``test_dataset()``, and no ``has_test_set`` attribute
    that is False (an image folder or a table with ``test_fraction=0``)."""
    return callable(getattr(data, "test_dataset", None)) and getattr(data, "has_test_set", True) is not False


def wants_test(cfg: DictConfig, data: Any) -> bool:
    """``trainer.test``: null means yes when the data has a test set (in a stand-alone run); true insists.

    Raises:
        ConfigError: ``trainer.test=true`` without a test set or evaluation, or in a parallel run.
    """
    test = cfg.trainer.get("test")
    if test is False:
        return False
    stand_alone = choice(cfg.parallel.mode) == "stand_alone"
    if test is None:
        return has_test_set(data) and bool(cfg.trainer.evaluate) and stand_alone
    if not has_test_set(data):
        holds = "holds no test split here (data.test_fraction=0)" if callable(getattr(data, "test_dataset", None)) \
            else "has none"
        raise ConfigError(f"trainer.test=true needs a data module with a test_dataset(); {type(data).__name__} "
                          f"{holds}: set trainer.test=false (or null: test when the data has a test set)")
    if not cfg.trainer.evaluate:
        raise ConfigError("trainer.test=true needs trainer.evaluate=true (the metrics, and best.ckpt, come from the "
                          "evaluation)")
    if not stand_alone:
        raise ConfigError(f"trainer.test=true runs in stand-alone runs only (parallel={choice(cfg.parallel.mode)}); "
                          "evaluate the test set afterwards with python -m trainkit.evaluate RUN_DIR --split test")
    return True


def evaluate_test_set(model: Model, wrapper: TrainingWrapper, test_set: Any, best_checkpoint: Path,
              step: int, epoch: Optional[int], run_log=None, best_in_memory: bool = False) -> Dict[str, float]:
    """Evaluate `best_checkpoint`'s weights (and their EMA twin) on `test_set`; record and return ``test/*``.

    The wrapper's own values are put back afterwards, so the run's objects still hold the last weights. Without a
    ``best.ckpt`` (no evaluation improved), the last weights are tested, and the log says so. `best_in_memory`:
    this run saved `best_checkpoint` from the wrapper at its last step (``BestCheckpoint.holds_last_state``), so
    the wrapper holds its weights and the file is not read again (ResNet-50: 283 MB, 0.85 s with the copies).
    """
    if best_in_memory and best_checkpoint.is_file():
        return _recorded(_evaluated(model, wrapper, test_set), str(best_checkpoint), step, epoch, run_log)
    # The weights and their EMA only: the optimizer's state (its learning-rate table among it) may have another
    # shape by now, in a finished run continued for more epochs, and is not what a test evaluates.
    # Written in place (graph_reuse.assign_in_place), never with set_data: the train step's graph, which a sweep's
    # next job may train again, keeps reading the Parameters' own memory.
    parts = [part for part in (wrapper.network, wrapper.ema) if part is not None]
    tested = {p.name: p for part in parts for p in part.get_parameters()}
    live = {name: p.asnumpy().copy() for name, p in tested.items()}
    source = "the last weights"
    if best_checkpoint.is_file():
        saved = ms.load_checkpoint(str(best_checkpoint))
        for name, parameter in tested.items():
            if name in saved:
                assign_in_place(parameter, saved[name].asnumpy())
        source = str(best_checkpoint)
    try:
        result = _evaluated(model, wrapper, test_set)
    finally:
        for name, parameter in tested.items():
            assign_in_place(parameter, live[name])
    return _recorded(result, source, step, epoch, run_log)


def _evaluated(model: Model, wrapper: TrainingWrapper, test_set: Any) -> Dict[str, float]:
    """``test/*`` of the weights the network holds, and ``test_ema/*`` with the EMA's swapped in.

    Evaluated once: a batch shape the validation set did not compile (a test split of another size) runs op by op
    for its first two calls -- one batch, live and EMA -- instead of compiling the evaluation graph again
    (``trainkit.step.rare_shapes``: on the quick start 0.03 s against 0.31 s; the figures are the same bits).
    """
    network = model.eval_network
    op_by_op = network.new_shapes_op_by_op if isinstance(network, OpByOpForNewShapes) else contextlib.nullcontext
    with op_by_op():
        result = _prefixed("test", model.eval(test_set, dataset_sink_mode=False))
        if wrapper.ema is not None:
            with ema_weights(wrapper.ema):
                result.update(_prefixed("test_ema", model.eval(test_set, dataset_sink_mode=False)))
    return result


def _recorded(result: Dict[str, float], source: str, step: int, epoch: Optional[int], run_log) -> Dict[str, float]:
    """`result` logged, recorded in the run log at `step` and returned as the final metrics' ``test_*``."""
    if run_log is not None:
        run_log.scalars(step, result, epoch=epoch)
    log.info("test set, %s: %s", source, ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
    return {tag.replace("/", "_"): value for tag, value in result.items()}
