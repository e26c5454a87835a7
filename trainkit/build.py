"""Build what a config describes -- data, model, loss network, optimizer, wrapper, Model, callbacks -- with the
checks that belong to each, so every bad value stops naming its key before anything compiles.

``trainkit.app.train`` calls these in order; each takes the composed config (or one group of it) and the objects
built before it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import mindspore as ms
import mindspore.dataset as ds
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from mindspore import amp, nn
from mindspore.train import Accuracy, Loss, Model
from omegaconf import DictConfig, OmegaConf

from trainkit.callbacks import BestCheckpoint, Evaluation, NonFiniteStop, Progress, RunLog, TrainMetrics
from trainkit.callbacks.training_checkpoint import StartAt, TrainingCheckpoint
from trainkit.checkpoint import TrainingCheckpoint as SavedCheckpoint
from trainkit.config import choice
from trainkit.errors import ConfigError
from trainkit.finetune import model_arguments
from trainkit.mixed_precision import Float32EvalCell, build_loss_network
from trainkit.wrapper import TrainingWrapper

log = logging.getLogger("trainkit")


# ------------------------------------------------------------------- instantiating `_target_` nodes
def instantiate_group(group: str, node: DictConfig, **kwargs):
    """``hydra.utils.instantiate`` with errors that name the config group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__ if error.__cause__ is not None else error
        raise group_error(group, node, cause) from error


def group_error(group: str, node: DictConfig, error: BaseException) -> ConfigError:
    """``data.batch_size must be ...`` when the message starts with an argument's name, else the group and target."""
    message = " ".join(str(error).split())  # one line: Hydra's and Python's messages can span several
    name = message.split(" ", 1)[0]
    if name.isidentifier() and name in node and message.startswith(f"{name} must"):
        return ConfigError(f"{group}.{message}")
    return ConfigError(f"{group} ({node.get('_target_')}): {message}")


# ------------------------------------------------------------------- data and model
def build_model(cfg: DictConfig, data: Any) -> nn.Cell:
    """The backbone, with its keys left null filled from the data (fine-tuning keys are applied after building)."""
    return instantiate_group("model", model_arguments(cfg.model), **model_args_from_data(cfg.model, data))


def model_args_from_data(model: DictConfig, data: Any) -> Dict[str, int]:
    """Fill the model's ``num_classes``/``in_channels`` left null from the data; check those set by hand."""
    filled = {}
    for key, attribute in (("num_classes", "num_classes"), ("in_channels", "image_channels")):
        if key not in model or getattr(data, attribute, None) is None:
            continue
        given, actual = model[key], getattr(data, attribute)
        if given is None:
            filled[key] = actual
        elif key == "in_channels" and given != actual:
            raise ConfigError(f"model.in_channels={given} but the data has {actual}-channel images: "
                              f"set model.in_channels={actual} or null")
        elif key == "num_classes" and given < actual:
            raise ConfigError(f"model.num_classes={given} but the data has {actual} classes: "
                              f"set model.num_classes={actual} or null")
    return filled


def build_loss_fn() -> nn.Cell:
    """The loss Cell, called as ``loss(network_output, label)``."""
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def build_loss_network_for(cfg: DictConfig, backbone: nn.Cell, loss_fn: nn.Cell) -> nn.Cell:
    """The backbone under ``amp.level`` with a float32 loss after it."""
    return build_loss_network(backbone, loss_fn, choice(cfg.amp.level))


# ------------------------------------------------------------------- optimisation
def build_learning_rates(cfg: DictConfig, lr: float, steps_per_epoch: int, accumulation_steps: int) -> List[float]:
    """One learning rate per optimizer update over the whole run (windows may straddle epochs), from base rate `lr`."""
    schedule = instantiate_group("lr_schedule", cfg.lr_schedule)
    try:
        return schedule(lr=lr, epochs=cfg.trainer.epochs,
                        updates_per_epoch=steps_per_epoch / accumulation_steps)
    except (TypeError, ValueError) as error:
        raise group_error("lr_schedule", cfg.lr_schedule, error) from error


def build_optimizer(cfg: DictConfig, backbone: nn.Cell, learning_rates: List[float]) -> nn.Optimizer:
    """``optimizer._target_(backbone.trainable_params(), learning_rate=learning_rates, **the other keys)``."""
    node = OmegaConf.to_container(cfg.optimizer, resolve=True)
    node.pop("lr")
    factory = instantiate_group("optimizer", OmegaConf.create(node), _partial_=True)
    try:
        return factory(backbone.trainable_params(), learning_rate=learning_rates)
    except (TypeError, ValueError) as error:
        raise group_error("optimizer", cfg.optimizer, error) from error


def build_wrapper(cfg: DictConfig, loss_network: nn.Cell, optimizer: nn.Optimizer) -> TrainingWrapper:
    """``wrapper._target_(loss_network, optimizer, loss_scale=<built from the loss_scale* keys>, **the rest)``."""
    node = OmegaConf.to_container(cfg.wrapper, resolve=True, enum_to_str=True)
    kind, value = node.pop("loss_scale"), node.pop("loss_scale_value")
    factor, window = node.pop("scale_factor"), node.pop("scale_window")
    loss_scale = {"none": lambda: None,
                  "static": lambda: amp.StaticLossScaler(value),
                  "dynamic": lambda: amp.DynamicLossScaler(value, factor, window)}[kind]()
    factory = instantiate_group("wrapper", OmegaConf.create(node), _partial_=True)
    try:
        return factory(loss_network, optimizer, loss_scale=loss_scale)
    except (TypeError, ValueError) as error:
        raise group_error("wrapper", cfg.wrapper, error) from error


def build_model_runner(wrapper: TrainingWrapper, loss_network: nn.Cell, loss_fn: nn.Cell) -> Model:
    """``mindspore.train.Model`` training `wrapper` and evaluating the backbone with a float32 loss."""
    return Model(wrapper, eval_network=Float32EvalCell(loss_network.backbone, loss_fn), eval_indexes=[0, 1, 2],
                 metrics={"accuracy": Accuracy(), "loss": Loss()})


# ------------------------------------------------------------------- callbacks
@dataclass
class RunCallbacks:
    """The callbacks of a run in the order they run, and the two whose results the run reports."""

    callbacks: List[ms.train.Callback]
    train_metrics: TrainMetrics
    evaluation: Evaluation


def build_callbacks(cfg: DictConfig, writer: bool, run_dir: Path, run_log: RunLog, model: Model,
                    wrapper: TrainingWrapper, eval_set: ds.Dataset, resumed: Optional[SavedCheckpoint],
                    steps_per_epoch: int, sink_size: int, samples_per_step: int, group_size: int) -> RunCallbacks:
    """The callbacks of a run, in the order they must run."""
    trainer = cfg.trainer
    # With sink_size, Model.train counts each sink as an "epoch"; callbacks see those units.
    sinks_per_epoch = steps_per_epoch // sink_size if sink_size > 0 else 1
    model_epochs = trainer.epochs * sinks_per_epoch
    metrics_cb = TrainMetrics(run_log, samples_per_step=samples_per_step,
                              log_every_n_steps=cfg.logger.log_every_n_steps)
    if resumed:
        metrics_cb.skipped_steps = resumed.skipped_steps
    eval_interval = trainer.eval_interval * sinks_per_epoch if trainer.eval_interval else model_epochs
    evaluation = Evaluation(model, eval_set, run_log, interval=eval_interval, ema=wrapper.ema,
                            dataset_sink_mode=False)
    callbacks: List[ms.train.Callback] = [StartAt(resumed.position.micro_steps if resumed else 0), metrics_cb]
    progress = choice(cfg.logger.progress)
    if writer and progress != "off":
        stream = None if progress == "auto" else _ForcedStream(progress == "bar")
        callbacks.append(Progress(model_epochs, sink_size if sink_size > 0 else steps_per_epoch, samples_per_step,
                                  stream=stream, every_n_steps=cfg.logger.log_every_n_steps,
                                  train_metrics=metrics_cb))
    checkpoints = run_dir / "checkpoints"
    checkpointer = None
    if writer:  # with trainer.save_checkpoints=false it saves only when NonFiniteStop asks
        checkpointer = TrainingCheckpoint(wrapper, checkpoints, steps_per_epoch, at_epoch_end=trainer.save_checkpoints,
                                          every_n_steps=trainer.checkpoint_every_n_steps if trainer.save_checkpoints
                                          else 0, keep=trainer.keep_checkpoints,
                                          skipped_steps=lambda: metrics_cb.skipped_steps, group_size=group_size,
                                          config=cfg)
        callbacks.append(checkpointer)
    nonfinite_limit = trainer.max_nonfinite_steps  # without loss scaling, skipped updates do not fix themselves
    if nonfinite_limit and getattr(wrapper, "skip_nonfinite", False) and not wrapper.loss_scaling:
        callbacks.append(NonFiniteStop(nonfinite_limit, save_checkpoint=checkpointer.save if checkpointer else None))
    callbacks.append(evaluation)
    if writer and trainer.save_checkpoints:
        best = trainer.best_metric
        callbacks.append(BestCheckpoint(evaluation, checkpoints, metric=eval_tag(best),
                                        mode="min" if best.endswith("loss") else "max", network=wrapper))
    return RunCallbacks(callbacks, metrics_cb, evaluation)


def eval_tag(metric: str) -> str:
    """``ema_accuracy`` -> ``eval_ema/accuracy``, ``loss`` -> ``eval/loss``."""
    return f"eval_ema/{metric[4:]}" if metric.startswith("ema_") else f"eval/{metric}"


def metric_name(tag: str) -> str:
    """The inverse of :func:`eval_tag`."""
    group, name = tag.split("/", 1)
    return f"ema_{name}" if group == "eval_ema" else name


class _ForcedStream:
    """stderr that reports itself as a terminal (``logger.progress=bar``) or not (``log``)."""

    def __init__(self, tty: bool):
        import sys

        self._stream = sys.stderr
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty

    def write(self, text: str) -> int:
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()
