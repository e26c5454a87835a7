"""Build what a config describes -- data, model, loss network, optimizer, wrapper, Model, callbacks -- with the
checks that belong to each, so every bad value stops naming its key before anything compiles.

The :class:`~trainkit.app.run_loop.Run` calls these in order; each takes the composed config (or one group of it)
and the objects built before it, except the callbacks, which are built from the run's plan.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import mindspore.dataset as ds
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from mindspore import amp, nn
from mindspore.train import Metric, Model
from omegaconf import DictConfig, OmegaConf

from trainkit import kernels
from trainkit.app.finetune import model_arguments
from trainkit.app.plan import RunPlan
from trainkit.app.stopping import stop_callbacks
from trainkit.app.targets import IMPLEMENTATION_KEYS, accepted_arguments, floats_where_expected, required_arguments
from trainkit.callbacks import BestCheckpoint, Evaluation, NonFiniteStop, Progress, RunLog, TrainMetrics
from trainkit.callbacks.early_stopping import EarlyStopping
from trainkit.callbacks.order import sort_callbacks
from trainkit.callbacks.train_metrics import checked_scalars
from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint, StartAt
from trainkit.checks import choice
from trainkit.errors import ConfigError
from trainkit.models.conv import CONV_IMPLS, kernel_convolutions
from trainkit.models.conv_swap import swap_convolutions
from trainkit.models.dropout import streams_from_zero
from trainkit.models.fused_layers import LAYER_IMPLS, kernel_layers, swap_layers
from trainkit.parts.metrics import SampleMeanLoss
from trainkit.rundir import class_names, data_state
from trainkit.rundir.checkpoint_file import CONFIG_ENTRY, SavedCheckpoint
from trainkit.rundir.data_state import FittedData
from trainkit.rundir.kernel_path import fused_passes
from trainkit.rundir.stateful_parts import StatefulParts, is_stateful
from trainkit.step.mixed_precision import Float32EvalCell, build_loss_network, casts_to_half
from trainkit.step.wrapper import TrainingWrapper

DEFAULT_LAYER_IMPL = "auto"  # where the model config has no layer_impl: GELU and max pooling fused on CPU
DEFAULT_CONV_IMPL = "auto"  # where the model config has no conv_impl: a ported or user network's nn.Conv2d swapped

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
    """``data.batch_size must be ...`` when the message starts with an argument's name (or the whole key), else the
    group and target."""
    message = " ".join(str(error).split())  # one line: Hydra's and Python's messages can span several
    name = message.split(" ", 1)[0]
    if name.startswith(f"{group}."):  # the message names the full key already (data.augment.mixup_alpha ...)
        return ConfigError(message)
    if name.isidentifier() and name in node and message.startswith(f"{name} must"):
        return ConfigError(f"{group}.{message}")
    return ConfigError(f"{group} ({node.get('_target_')}): {message}")


# ------------------------------------------------------------------- data and model
def build_model(cfg: DictConfig, data: Any) -> nn.Cell:
    """The backbone, with its keys left null filled from the data (fine-tuning keys are applied after building).

    trainkit's Dropout layers get their random streams numbered from 0 in build order, so a resumed run's are the
    same. ``model.conv_impl`` (default ``auto``) goes to a model that takes it (trainkit's own); then every plain
    ``nn.Conv2d`` left in the network is swapped for that implementation (``trainkit.models.conv_swap``), and
    every exact ``nn.GELU`` and ``nn.MaxPool2d`` for trainkit's fused kernels where ``model.layer_impl`` (default
    ``auto``) says so (``trainkit.models.fused_layers``). Neither swap changes a Parameter."""
    node = model_arguments(cfg.model)
    conv_impl = str(node.get("conv_impl", DEFAULT_CONV_IMPL))
    if conv_impl not in CONV_IMPLS:
        raise ConfigError(f"model.conv_impl={conv_impl} is not valid: use one of {', '.join(CONV_IMPLS)}")
    layer_impl = str(node.get("layer_impl", DEFAULT_LAYER_IMPL))
    if layer_impl not in LAYER_IMPLS:
        raise ConfigError(f"model.layer_impl={layer_impl} is not valid: use one of {', '.join(LAYER_IMPLS)}")
    accepted = accepted_arguments(get_object(node._target_))[0]
    dropped = [key for key in IMPLEMENTATION_KEYS if key in node and key not in accepted]
    if dropped:
        node = OmegaConf.create({k: v for k, v in OmegaConf.to_container(node).items() if k not in dropped})
    with streams_from_zero():
        try:
            network = instantiate_group("model", node, **model_args_from_data(node, data))
        except ConfigError as error:
            raise with_suggested_model(error, data) from error
    try:
        swapped = swap_convolutions(network, conv_impl)
        layers = swap_layers(network, layer_impl)
    except ValueError as error:  # channel_major or fused where the kernels do not build
        raise ConfigError(f"model.{error}") from error
    if swapped:
        log.info("model.conv_impl=%s: %d nn.Conv2d run as trainkit's im2col convolution (NCHW)", conv_impl, swapped)
    if any(layers.values()):
        log.info("model.layer_impl=%s: %s run by trainkit's fused kernels", layer_impl,
                 ", ".join(f"{count} nn.{kind}" for kind, count in layers.items() if count))
    return network


def with_suggested_model(error: ConfigError, data: Any) -> ConfigError:
    """`error` with the model the data module names for itself (``suggested_model``: data=text's ``model=text_bag``
    ...) added, where it has one: the default recipe's small CNN built on texts fails for want of image channels."""
    suggested = getattr(data, "suggested_model", None)
    if not isinstance(suggested, str):
        return error
    return ConfigError(f"{error} ({type(data).__name__} trains with {suggested})")


# Data attributes that fill a model key of another name (the data-module protocol before keys matched).
DATA_ALIASES = {"in_channels": "image_channels"}


def model_args_from_data(model: DictConfig, data: Any) -> Dict[str, Any]:
    """The model's keys left null, filled from the data module's attributes of the same name (``num_classes``,
    ``in_channels``, ``in_features``, ``out_features``, ...); a key set by hand must agree with the data (for
    ``num_classes``: at least the data's)."""
    filled = {}
    required = required_arguments(get_object(model._target_))
    for key in model:
        key = str(key)
        if key.startswith("_"):
            continue
        attribute = key if getattr(data, key, None) is not None else DATA_ALIASES.get(key, key)
        actual = getattr(data, attribute, None)
        given = model[key]
        if given is None and actual is None and key in required:
            raise ConfigError(f"model.{key} is null, and the data ({type(data).__name__}) has no {key} to fill it "
                              f"from: set model.{key}")
        if actual is None or callable(actual):
            continue
        if given is None:
            filled[key] = actual
        elif key == "num_classes":
            if given < actual:
                raise ConfigError(f"model.num_classes={given} but the data has {actual} classes: "
                                  f"set model.num_classes={actual} or null")
        elif given != actual:
            what = f"{actual}-channel images" if key == "in_channels" else f"{attribute}={actual}"
            raise ConfigError(f"model.{key}={given} but the data has {what}: set model.{key}={actual} or null")
    return filled


def build_loss_fn(cfg: DictConfig) -> nn.Cell:
    """The ``loss`` group's Cell, called as ``loss(network_output, label)``."""
    loss_fn = instantiate_group("loss", cfg.loss)
    if not isinstance(loss_fn, nn.Cell):
        raise ConfigError(f"loss._target_={cfg.loss._target_} built a {type(loss_fn).__name__}, not a "
                          "mindspore.nn.Cell called as loss(network_output, label)")
    return loss_fn


def build_metrics(cfg: DictConfig) -> Optional[Dict[str, Metric]]:
    """``{name: Metric}`` from ``metrics``, and ``loss``; None with ``trainer.evaluate=false``."""
    if not cfg.trainer.evaluate:
        return None
    metrics: Dict[str, Metric] = {}
    for name, node in (cfg.get("metrics") or {}).items():
        metric = instantiate_group(f"metrics.{name}", node)
        if not isinstance(metric, Metric):
            raise ConfigError(f"metrics.{name}._target_={node._target_} built a {type(metric).__name__}, not a "
                              "mindspore.train.Metric")
        metrics[str(name)] = metric
    metrics["loss"] = SampleMeanLoss()  # MindSpore's Loss would average the batches' means
    return metrics


def build_user_callbacks(cfg: DictConfig) -> List[ms.train.Callback]:
    """The ``callbacks`` list's Callbacks, run after trainkit's own."""
    callbacks = []
    for index, node in enumerate(cfg.get("callbacks") or []):
        callback = instantiate_group(f"callbacks[{index}]", node)
        if not isinstance(callback, ms.train.Callback):
            raise ConfigError(f"callbacks[{index}]._target_={node._target_} built a {type(callback).__name__}, not "
                              "a mindspore.train.Callback")
        callbacks.append(callback)
    return callbacks


def build_loss_network_for(cfg: DictConfig, backbone: nn.Cell, loss_fn: nn.Cell) -> nn.Cell:
    """The backbone under ``amp.level`` with a float32 loss after it.

    Raises:
        ConfigError: half precision op by op (``trainer.mode=pynative``) over convolutions or layers that run
            trainkit's float32 kernels, which MindSpore would hand half-precision memory (``kernel_convolutions``,
            ``kernel_layers``).
    """
    level = choice(cfg.amp.level)
    loss_network = build_loss_network(backbone, loss_fn, level)
    if choice(cfg.trainer.mode) == "pynative" and casts_to_half(loss_network.backbone):
        convolutions = kernel_convolutions(loss_network.backbone)
        layers = [name.replace("_backbone.", "", 1) for name in kernel_layers(loss_network.backbone)]
        cause = f"amp={level}" if level != "O0" else "a model Cell cast by to_float to half precision"
        if convolutions:
            raise ConfigError(
                f"{cause} with trainer.mode=pynative: op by op, MindSpore casts the inputs of every operator to "
                f"float16, also of the float32 im2col kernel behind {len(convolutions)} convolutions "
                f"({convolutions[0]}, ...), which would compute garbage: use trainer.mode=graph, amp=O0, or "
                "model.conv_impl=native (MindSpore's own convolution)")
        if layers:
            raise ConfigError(
                f"{cause} with trainer.mode=pynative: op by op, MindSpore casts the inputs of every operator to "
                f"float16, also of the float32 kernels behind {len(layers)} GELU or max-pooling layers "
                f"({layers[0]}, ...), which would compute garbage: use trainer.mode=graph, amp=O0, or "
                "model.layer_impl=native (MindSpore's own layers)")
    return loss_network


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
    node = floats_where_expected(node)
    factory = instantiate_group("optimizer", OmegaConf.create(node), _partial_=True)
    try:
        return factory(backbone.trainable_params(), learning_rate=learning_rates)
    except (TypeError, ValueError, KeyError, RuntimeError) as error:  # MindSpore's validators and Adam's kwargs
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
        wrapper = factory(loss_network, optimizer, loss_scale=loss_scale)
    except (TypeError, ValueError) as error:
        raise group_error("wrapper", cfg.wrapper, error) from error
    if not isinstance(wrapper, TrainingWrapper):
        raise ConfigError(f"wrapper._target_={cfg.wrapper._target_} built a {type(wrapper).__name__}, not a "
                          "trainkit.TrainingWrapper (subclass it)")
    try:
        checked_scalars(wrapper.logged_scalars())
    except (TypeError, ValueError) as error:
        raise ConfigError(f"wrapper ({cfg.wrapper._target_}).logged_scalars(): {error}") from error
    passes = fused_passes(wrapper)  # the same list the checkpoints' kernel_path is recorded for
    if passes:
        log.info("%s: %s", " and ".join(passes), kernels.describe())
    return wrapper


def build_eval_network(loss_network: nn.Cell, loss_fn: nn.Cell, metrics: Optional[Dict[str, Metric]]
                       ) -> Optional[nn.Cell]:
    """The backbone with a float32 loss after it, as evaluation runs it (None without metrics: no evaluation)."""
    return None if metrics is None else Float32EvalCell(loss_network.backbone, loss_fn)


def build_model_runner(wrapper: TrainingWrapper, eval_network: Optional[nn.Cell],
                       metrics: Optional[Dict[str, Metric]]) -> Model:
    """``mindspore.train.Model`` training `wrapper` and evaluating `eval_network` (:func:`build_eval_network`) with
    `metrics` (none: no evaluation)."""
    if metrics is None:
        return Model(wrapper)
    return Model(wrapper, eval_network=eval_network, eval_indexes=[0, 1, 2], metrics=metrics)


# ------------------------------------------------------------------- callbacks
@dataclass
class RunCallbacks:
    """The callbacks of a run in the order they run, and the two whose results the run reports."""

    callbacks: List[ms.train.Callback]
    train_metrics: TrainMetrics
    evaluation: Optional[Evaluation]  # None with trainer.evaluate=false
    parts: StatefulParts = field(default_factory=StatefulParts)  # what each checkpoint saves of them, by name


def build_callbacks(plan: RunPlan, run_log: RunLog, model: Model, wrapper: TrainingWrapper, eval_set: ds.Dataset,
                    resumed: Optional[SavedCheckpoint], user_callbacks: Sequence[ms.train.Callback],
                    parts: StatefulParts, metadata: Optional[Dict[str, str]] = None,
                    config_text: Optional[str] = None, extra: Sequence[ms.train.Callback] = ()) -> RunCallbacks:
    """The callbacks `plan` asks for, with `user_callbacks` and `extra` (the profiler), sorted in the order they
    declare (:mod:`trainkit.callbacks.order`); their stateful parts registered in `parts` (``train_metrics``,
    ``best_checkpoint``, ``early_stopping``, each user callback with state). Every checkpoint they write,
    ``best.ckpt`` included, holds `metadata` (the data's class names and state: :func:`checkpoint_metadata`) and
    the config (`config_text`: its YAML as ``.hydra/config.yaml`` holds it; needed on the writer); the training
    checkpoints hold the parts' state too."""
    steps = plan.steps
    writer = plan.writer
    if writer and config_text is None:
        raise ValueError("build_callbacks: the writer's checkpoints need the config's text")
    metrics_cb = TrainMetrics(run_log, samples_per_step=steps.samples_per_step,
                              log_every_n_steps=plan.log_every_n_steps, scalars=wrapper.logged_scalars())
    if resumed:
        metrics_cb.skipped_steps = resumed.skipped_steps
    parts.register("train_metrics", metrics_cb)
    evaluation = None
    if plan.evaluate:
        evaluation = Evaluation(model, eval_set, run_log, interval=plan.eval_every, ema=wrapper.ema,
                                dataset_sink_mode=False)
    callbacks: List[ms.train.Callback] = [StartAt(resumed.position.micro_steps if resumed else 0), metrics_cb]
    if writer and plan.progress != "off":
        stream = None if plan.progress == "auto" else _ForcedStream(plan.progress == "bar")
        callbacks.append(Progress(steps.model_epochs, steps.steps_per_model_epoch, steps.samples_per_step,
                                  stream=stream, every_n_steps=plan.log_every_n_steps, train_metrics=metrics_cb))
    checkpointer = None
    if writer:  # with trainer.save_checkpoints=false it saves only when NonFiniteStop asks
        checkpointer = PeriodicCheckpoint(wrapper, plan.checkpoints, steps.steps_per_epoch,
                                          at_epoch_end=plan.save_checkpoints,
                                          every_n_steps=plan.checkpoint_every_n_steps if plan.save_checkpoints else 0,
                                          keep=plan.keep_checkpoints, skipped_steps=lambda: metrics_cb.skipped_steps,
                                          group_size=plan.group_size, config_text=config_text, metadata=metadata,
                                          parts=parts)
        callbacks.append(checkpointer)
    # without loss scaling, skipped updates do not fix themselves
    if plan.max_nonfinite_steps and getattr(wrapper, "skip_nonfinite", False) and not wrapper.loss_scaling:
        callbacks.append(NonFiniteStop(plan.max_nonfinite_steps,
                                       save_checkpoint=checkpointer.save if checkpointer else None))
    if evaluation is not None:
        callbacks.append(evaluation)
        if plan.best_checkpoint:
            best = BestCheckpoint(evaluation, plan.checkpoints, metric=plan.best_metric, mode=plan.best_mode,
                                  network=wrapper, metadata={**(metadata or {}), CONFIG_ENTRY: config_text})
            parts.register("best_checkpoint", best)
            callbacks.append(best)
    callbacks += stop_callbacks(plan, evaluation, checkpointer)  # signals, early stopping
    for callback in callbacks:
        if isinstance(callback, EarlyStopping):
            parts.register("early_stopping", callback)
    for name, callback in user_parts(user_callbacks):
        if name not in parts:  # registered before (restored before anything was written)
            parts.register(name, callback)
    return RunCallbacks(sort_callbacks([*callbacks, *user_callbacks, *extra]), metrics_cb, evaluation, parts)


#: trainkit's parts built after the resume's check, and the check of a state stored for each (before anything is
#: written). The parts built before it (the data, the user callbacks) are restored then.
OWN_PART_CHECKS = {"train_metrics": TrainMetrics.checked_state, "early_stopping": EarlyStopping.checked_state,
                   "best_checkpoint": BestCheckpoint.checked_state}


def restore_before_writing(resumed: SavedCheckpoint, parts: StatefulParts) -> Tuple[str, ...]:
    """Before the run directory is written: the parts registered so far (the data, the user callbacks) take their
    stored state (once), and trainkit's own parts' stored state is checked, so a state that does not fit is one
    line and leaves the directory as it was. Returns the names restored (:meth:`StatefulParts.load` of the whole
    registry skips them afterwards, and says in one line which parts the checkpoint holds no state for)."""
    source = f"checkpoint {resumed.path}"
    stored = dict(resumed.parts or {})
    for name, check in OWN_PART_CHECKS.items():
        if isinstance(stored.get(name), dict):
            checker = StatefulParts()
            checker.register(name, _Checked(check))
            checker.load({name: stored[name]}, source)
    restored = tuple(name for name in parts.names() if name in stored)
    parts.load({name: stored[name] for name in restored}, source, report_missing=False)
    return restored


class _Checked:
    """A stand-in part whose load only checks a stored state (trainkit's own parts are built after the check)."""

    def __init__(self, check) -> None:
        self.check = check
        self.part_kind = check.__qualname__.split(".")[0]  # what an error names: EarlyStopping, TrainMetrics

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.check(state)


def check_user_callback_states(callbacks: Sequence[Any]) -> None:
    """Each user callback with state gives JSON data from ``state_dict()`` before anything compiles (a bad one
    would otherwise stop the run at its first checkpoint); raises the one-line PartStateError naming it."""
    user_parts(callbacks).checkpoint_entries()


def user_parts(callbacks: Sequence[Any]) -> StatefulParts:
    """The user callbacks that save and restore themselves, each under its stable name."""
    parts = StatefulParts()
    for name, callback in user_callback_names(callbacks):
        if is_stateful(callback):
            parts.register(name, callback)
    return parts


def user_callback_names(callbacks: Sequence[Any]) -> List[Tuple[str, Any]]:
    """A stable name per user callback for the registry of stateful parts: ``callbacks/<class>``, numbered
    ``callbacks/<class>#2`` ... when a class comes more than once (in the order of the ``callbacks`` list)."""
    counts: Dict[str, int] = {}
    named = []
    for callback in callbacks:
        kind = type(callback).__qualname__
        counts[kind] = counts.get(kind, 0) + 1
        named.append((f"callbacks/{kind}" + (f"#{counts[kind]}" if counts[kind] > 1 else ""), callback))
    return named


def checkpoint_metadata(fitted: FittedData) -> Dict[str, str]:
    """What every checkpoint of a run appends of its data module, from its registered part (``data``): its class
    names and fitted state, in the entries the tools read (:mod:`trainkit.rundir.class_names`,
    :mod:`trainkit.rundir.data_state`)."""
    return {**class_names.checkpoint_entries(fitted.class_names), **data_state.checkpoint_entries(fitted.state)}


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
