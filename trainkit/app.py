"""``train(cfg)``: build everything a config describes, check it, train with ``mindspore.train.Model``.

Everything that can be wrong in the input -- values, data files, the model's and the data's
shapes -- is checked before the first step compiles. ``python -m trainkit`` is a thin Hydra main
around this function; scripts and tests call it in-process::

    from trainkit.app import train
    from trainkit.config import compose_config
    result = train(compose_config(["recipe=digits_quickstart", "run_dir=/tmp/run"]))
    result.metrics["accuracy"]
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from mindspore import amp, nn
from mindspore.train import Accuracy, Loss, Model
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from trainkit.callbacks import BestCheckpoint, Evaluation, NonFiniteStop, Progress, RunLog, TrainMetrics
from trainkit.callbacks.training_checkpoint import StartAt, TrainingCheckpoint
from trainkit.checkpoint import TrainingCheckpoint as SavedCheckpoint
from trainkit.checkpoint import check_resumable, checkpoint_files, find_resume_checkpoint, restore
from trainkit.config import check_config, choice
from trainkit.errors import ConfigError
from trainkit.mixed_precision import Float32EvalCell, applied_amp_level, build_loss_network
from trainkit.parallel import describe_job, job_metrics, prepare_data, scaled_learning_rate, setup_parallel
from trainkit.wrapper import TrainingWrapper

log = logging.getLogger("trainkit")


@dataclass
class TrainResult:
    """What a run produced: final metrics and the objects it built (for scripts, tests and notebooks)."""

    metrics: Dict[str, float]
    run_dir: Path
    model: Model
    wrapper: TrainingWrapper
    network: nn.Cell
    optimizer: nn.Optimizer
    data: Any
    callbacks: List[ms.train.Callback] = field(default_factory=list)


def train(cfg: DictConfig) -> TrainResult:
    """Train as `cfg` says and return the final metrics and the built objects.

    Raises:
        ConfigError: a config value is invalid (the message names the key).
        DataError: the data is missing or corrupt (the message names the path).
    """
    check_config(cfg)
    run_dir = _run_dir(cfg)
    trainer = cfg.trainer
    _set_context(trainer)
    parallel = setup_parallel(cfg.parallel)
    rank, group_size = parallel.rank, parallel.group_size
    writer = parallel.writer  # the rank that writes config, metrics, events, progress and checkpoints
    continuing = _continues_run_dir(trainer.resume, run_dir)
    if writer and not continuing:
        _check_run_dir_is_new(run_dir, cfg.logger.metrics_file)

    data = _instantiate("data", cfg.data)
    prepare_data(data, parallel)  # rank 0 first: only one process per machine downloads
    train_set = data.train_dataset(num_shards=group_size, shard_id=rank)
    eval_set = data.eval_dataset()  # the whole set on every rank: a sharded one is padded with repeats
    steps_per_epoch = train_set.get_dataset_size()
    if steps_per_epoch < 1:
        raise ConfigError(f"data.batch_size={cfg.data.get('batch_size')} is larger than the training set "
                          f"({_describe(data)}): no full batch per epoch")
    sink_size = _sink_size(trainer, steps_per_epoch)
    _check_accumulation(cfg, steps_per_epoch)
    backbone = _instantiate("model", cfg.model, **_from_data(cfg.model, data))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    with _inside(run_dir):  # MindSpore's O1 rewrite writes rewritten_network/ into the current directory
        loss_network = build_loss_network(backbone, loss_fn, choice(cfg.amp.level))
    accumulation_steps = cfg.wrapper.accumulation_steps
    lr = scaled_learning_rate(cfg.optimizer.lr, cfg.parallel, parallel)
    learning_rates = _learning_rates(cfg, lr, steps_per_epoch, accumulation_steps)
    optimizer = _optimizer(cfg, backbone, learning_rates)
    wrapper = _wrapper(cfg, loss_network, optimizer)
    model = Model(wrapper, eval_network=Float32EvalCell(loss_network.backbone, loss_fn), eval_indexes=[0, 1, 2],
                  metrics={"accuracy": Accuracy(), "loss": Loss()})
    resumed = _resume(cfg, run_dir, wrapper, steps_per_epoch, group_size)
    done = resumed.position.micro_steps if resumed else 0
    initial_epoch = _initial_epoch(done, steps_per_epoch, sink_size, resumed)

    if writer:  # only now: a run stopped by bad input leaves no trace in the run directory
        if resumed and resumed.path.parent == run_dir / "checkpoints":
            _set_aside_later_checkpoints(resumed)
        _save_config(cfg, run_dir)
    if done:
        train_set.set_init_step(done)  # Model.train then continues the data mid-epoch where the checkpoint left it
        if choice(trainer.resume_data) == "exact":
            log.info("replaying the data pipeline through %d micro-batches so augmentations match exactly "
                     "(trainer.resume_data=fast skips the replay)", done)
    samples_per_step = cfg.data.get("batch_size", 1) * group_size
    # With sink_size, Model.train counts each sink as an "epoch"; callbacks see those units.
    model_epochs = trainer.epochs * (steps_per_epoch // sink_size if sink_size > 0 else 1)
    run_log = RunLog(run_dir, tensorboard=cfg.logger.tensorboard and writer,
                     metrics_file=cfg.logger.metrics_file if writer else None)
    callbacks, metrics_cb, evaluation = _callbacks(cfg, writer, run_dir, run_log, model, wrapper, eval_set, resumed,
                                                   steps_per_epoch, sink_size, samples_per_step, group_size)

    log.info("%s: %s on %s, %d steps/epoch of %d samples (%d per rank x %d), %d epochs, %s mode, amp %s, run dir %s",
             _describe_target(cfg.model), _count(backbone), _describe(data), steps_per_epoch, samples_per_step,
             samples_per_step // group_size, group_size, trainer.epochs, choice(trainer.mode),
             applied_amp_level(loss_network.backbone), run_dir)
    if choice(cfg.parallel.mode) != "stand_alone":
        log.info("%s", describe_job(cfg.parallel, parallel, samples_per_step // group_size, accumulation_steps,
                                    cfg.optimizer.lr, lr))
    if resumed:
        log.info("resuming from %s: epoch %d, step %d of %d in it (%d micro-batches done, %d optimizer steps)",
                 resumed.path, done // steps_per_epoch + 1, done % steps_per_epoch, steps_per_epoch, done,
                 int(optimizer.global_step.asnumpy().item()))
    start = time.perf_counter()
    try:
        model.train(model_epochs, train_set, callbacks=callbacks, dataset_sink_mode=trainer.dataset_sink_mode,
                    sink_size=sink_size, initial_epoch=initial_epoch)
        elapsed = time.perf_counter() - start
        metrics = _final_metrics(evaluation, metrics_cb, optimizer, elapsed,
                                 trainer.epochs * steps_per_epoch - done, samples_per_step)
        metrics["amp_level"] = float(applied_amp_level(loss_network.backbone)[1])  # 2.0: O2 ran
        if choice(cfg.parallel.mode) != "stand_alone":
            metrics.update(job_metrics(parallel, samples_per_step // group_size, accumulation_steps))
        run_log.hparams(_hyper_parameters(cfg), {f"final/{k}": v for k, v in metrics.items()})
    finally:
        run_log.close()
    log.info("finished: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    return TrainResult(metrics, run_dir, model, wrapper, loss_network.backbone, optimizer, data, callbacks)


# ------------------------------------------------------------------- building
def _instantiate(group: str, node: DictConfig, **kwargs):
    """``hydra.utils.instantiate`` with errors that name the config group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__ if error.__cause__ is not None else error
        raise _group_error(group, node, cause) from error


def _group_error(group: str, node: DictConfig, error: BaseException) -> ConfigError:
    """``data.batch_size must be ...`` when the message starts with an argument's name, else the group and target."""
    message = str(error)
    name = message.split(" ", 1)[0]
    if name.isidentifier() and name in node and message.startswith(f"{name} must"):
        return ConfigError(f"{group}.{message}")
    return ConfigError(f"{group} ({node.get('_target_')}): {message}")


def _learning_rates(cfg: DictConfig, lr: float, steps_per_epoch: int, accumulation_steps: int) -> List[float]:
    """One learning rate per optimizer update over the whole run (windows may straddle epochs), from base rate `lr`."""
    schedule = _instantiate("lr_schedule", cfg.lr_schedule)
    try:
        return schedule(lr=lr, epochs=cfg.trainer.epochs,
                        updates_per_epoch=steps_per_epoch / accumulation_steps)
    except (TypeError, ValueError) as error:
        raise _group_error("lr_schedule", cfg.lr_schedule, error) from error


def _optimizer(cfg: DictConfig, backbone: nn.Cell, learning_rates: List[float]) -> nn.Optimizer:
    node = OmegaConf.to_container(cfg.optimizer, resolve=True)
    node.pop("lr")
    factory = _instantiate("optimizer", OmegaConf.create(node), _partial_=True)
    try:
        return factory(backbone.trainable_params(), learning_rate=learning_rates)
    except (TypeError, ValueError) as error:
        raise _group_error("optimizer", cfg.optimizer, error) from error


def _wrapper(cfg: DictConfig, loss_network: nn.Cell, optimizer: nn.Optimizer) -> TrainingWrapper:
    node = OmegaConf.to_container(cfg.wrapper, resolve=True, enum_to_str=True)
    kind, value = node.pop("loss_scale"), node.pop("loss_scale_value")
    factor, window = node.pop("scale_factor"), node.pop("scale_window")
    loss_scale = {"none": lambda: None,
                  "static": lambda: amp.StaticLossScaler(value),
                  "dynamic": lambda: amp.DynamicLossScaler(value, factor, window)}[kind]()
    factory = _instantiate("wrapper", OmegaConf.create(node), _partial_=True)
    try:
        return factory(loss_network, optimizer, loss_scale=loss_scale)
    except (TypeError, ValueError) as error:
        raise _group_error("wrapper", cfg.wrapper, error) from error


def _callbacks(cfg: DictConfig, writer: bool, run_dir: Path, run_log: RunLog, model: Model, wrapper: TrainingWrapper,
               eval_set: ds.Dataset, resumed: Optional[SavedCheckpoint], steps_per_epoch: int, sink_size: int,
               samples_per_step: int, group_size: int):
    """The callbacks of a run, in the order they must run; returns them with TrainMetrics and Evaluation."""
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
        callbacks.append(BestCheckpoint(evaluation, checkpoints, metric=_eval_tag(best),
                                        mode="min" if best.endswith("loss") else "max", network=wrapper))
    return callbacks, metrics_cb, evaluation


# ------------------------------------------------------------------- resume
def _continues_run_dir(resume: Optional[str], run_dir: Path) -> bool:
    """Whether `trainer.resume` continues the run in `run_dir` (rather than starting one there)."""
    if resume is None:
        return False
    if resume == "auto":
        return True
    path = Path(resume).expanduser().resolve()
    return path == run_dir or run_dir in path.parents


def _resume(cfg: DictConfig, run_dir: Path, wrapper: TrainingWrapper, steps_per_epoch: int,
            group_size: int) -> Optional[SavedCheckpoint]:
    """Find, check and load the checkpoint `trainer.resume` names; None for a new run."""
    resume = cfg.trainer.resume
    if resume is None:
        return None
    checkpoint = find_resume_checkpoint(str(resume), run_dir)
    if checkpoint is None:
        log.info("trainer.resume=auto: no checkpoint in %s; starting a new run", run_dir / "checkpoints")
        return None
    check_resumable(checkpoint, cfg, wrapper, steps_per_epoch, group_size)
    total = cfg.trainer.epochs * steps_per_epoch
    if checkpoint.position.micro_steps >= total:
        raise ConfigError(f"checkpoint {checkpoint.path} is at the end of the run ({checkpoint.position.micro_steps} "
                          f"of {total} micro-batches): nothing is left to train; its weights are ready to export "
                          "(python -m trainkit.export)")
    restore(checkpoint, wrapper)
    return checkpoint


def _initial_epoch(done: int, steps_per_epoch: int, sink_size: int, resumed: Optional[SavedCheckpoint]) -> int:
    """``Model.train``'s ``initial_epoch`` for `done` micro-batches (in sinks when sinking: MindSpore's epochs)."""
    if sink_size > 0:
        if done % sink_size:
            raise ConfigError(f"checkpoint {resumed.path} is at micro-batch {done}, inside a sink of "
                              f"trainer.sink_size={sink_size}: resume it with trainer.dataset_sink_mode=false")
        return done // sink_size
    return done // steps_per_epoch


def _set_aside_later_checkpoints(resumed: SavedCheckpoint) -> None:
    """Resuming from an older checkpoint of this run: move the newer ones aside (never delete them)."""
    files = checkpoint_files(resumed.path.parent)
    later = files[files.index(resumed.path) + 1:] if resumed.path in files else []
    if not later:
        return
    folder = resumed.path.parent / time.strftime("superseded-%Y%m%d-%H%M%S")
    folder.mkdir()
    for path in later:
        path.rename(folder / path.name)
    log.warning("resuming from %s: moved the %d later checkpoints of this run to %s", resumed.path.name, len(later),
                folder)


# ------------------------------------------------------------------- checks
def _run_dir(cfg: DictConfig) -> Path:
    try:
        run_dir = Path(cfg.run_dir)
    except InterpolationResolutionError as error:
        raise ConfigError("run_dir is not set: outside `python -m trainkit` pass run_dir=PATH "
                          "(compose_config([..., 'run_dir=PATH']))") from error
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir.resolve()


def _sink_size(trainer: DictConfig, steps_per_epoch: int) -> int:
    """The sink size Model.train gets: checked against the epoch, then -1 where MindSpore does not sink."""
    sink_size = trainer.sink_size
    if sink_size == -1:
        return -1
    if sink_size > steps_per_epoch or steps_per_epoch % sink_size:
        divisors = [d for d in range(1, steps_per_epoch + 1) if steps_per_epoch % d == 0]
        shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
        raise ConfigError(f"trainer.sink_size={sink_size} is not valid for an epoch of {steps_per_epoch} steps: "
                          f"use -1 (one sink per epoch) or a divisor of {steps_per_epoch} ({shown})")
    if not trainer.dataset_sink_mode:
        return -1
    if ms.get_context("device_target") == "CPU":  # Model.train runs step by step there, whatever the sink size
        log.info("trainer.dataset_sink_mode: MindSpore does not sink on CPU; steps run one by one")
        return -1
    return sink_size


def _check_accumulation(cfg: DictConfig, steps_per_epoch: int) -> None:
    """A window must fit in the run; a last incomplete window is dropped, which is worth a warning."""
    micro_steps, k = cfg.trainer.epochs * steps_per_epoch, cfg.wrapper.accumulation_steps
    if k > micro_steps:
        raise ConfigError(f"wrapper.accumulation_steps={k} is not valid for a run of {micro_steps} micro-batches "
                          f"({cfg.trainer.epochs} epochs of {steps_per_epoch}): no window would complete, so "
                          f"nothing would train; use at most {micro_steps}")
    if micro_steps % k:
        log.warning("wrapper.accumulation_steps=%d: the last %d of %d micro-batches do not complete a window and "
                    "are not applied", k, micro_steps % k, micro_steps)


def _check_run_dir_is_new(run_dir: Path, metrics_file: Optional[str]) -> None:
    """Refuse to mix two runs in one directory (``trainer.resume=auto`` continues the one there)."""
    earlier = [name for name in (".hydra/config.yaml", metrics_file, "tensorboard", "checkpoints")
               if name and (run_dir / name).exists()]
    if earlier:
        raise ConfigError(f"{run_dir} already holds a run ({', '.join(earlier)}): nothing was changed there; "
                          "choose a new directory with hydra.run.dir=PATH (run_dir=PATH in-process), or continue "
                          "that run with trainer.resume=auto")


def _save_config(cfg: DictConfig, run_dir: Path) -> None:
    """The composed config (and, under Hydra, its own config and the overrides) in ``.hydra/``, as Hydra would.

    A resumed run keeps the first run's files and writes its own into ``.hydra/resume-<n>/``.
    """
    folder = run_dir / ".hydra"
    if (folder / "config.yaml").exists():
        number = 1
        while (folder / f"resume-{number}").exists():
            number += 1
        folder = folder / f"resume-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), folder / "hydra.yaml")
        OmegaConf.save(hydra_cfg.overrides.task, folder / "overrides.yaml")


def _from_data(model: DictConfig, data: Any) -> Dict[str, int]:
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


def _set_context(trainer: DictConfig) -> None:
    mode = ms.GRAPH_MODE if choice(trainer.mode) == "graph" else ms.PYNATIVE_MODE
    ms.set_context(mode=mode)
    if trainer.device_target != "auto":
        try:
            ms.set_context(device_target=trainer.device_target)
        except (RuntimeError, ValueError) as error:
            raise ConfigError(f"trainer.device_target={trainer.device_target} is not available to this MindSpore "
                              f"build: use auto or {ms.get_context('device_target')} ({error})") from error
    ms.set_seed(trainer.seed)
    ds.config.set_seed(trainer.seed)
    ds.config.set_fast_recovery(choice(trainer.resume_data) == "fast")
    np.random.seed(trainer.seed)
    random.seed(trainer.seed)


@contextlib.contextmanager
def _inside(directory: Path):
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)


# ------------------------------------------------------------------- reporting
def _final_metrics(evaluation: Evaluation, metrics_cb: TrainMetrics, optimizer: nn.Optimizer, elapsed: float,
                   steps: int, samples_per_step: int) -> Dict[str, float]:
    metrics = {_metric_name(tag): float(value) for tag, value in evaluation.latest.items() if "/" in tag}
    metrics.update({
        "train_loss": float(metrics_cb.last.get("train/loss", float("nan"))),
        "skipped_steps": float(metrics_cb.skipped_steps),
        "optimizer_steps": float(optimizer.global_step.asnumpy().item()),
        "train_seconds": elapsed,
        "samples_per_second": steps * samples_per_step / elapsed,
    })
    return metrics


def _eval_tag(metric: str) -> str:
    """``ema_accuracy`` -> ``eval_ema/accuracy``, ``loss`` -> ``eval/loss``."""
    return f"eval_ema/{metric[4:]}" if metric.startswith("ema_") else f"eval/{metric}"


def _metric_name(tag: str) -> str:
    """The inverse of :func:`_eval_tag`."""
    group, name = tag.split("/", 1)
    return f"ema_{name}" if group == "eval_ema" else name


def _hyper_parameters(cfg: DictConfig) -> Dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    container.pop("run_dir", None)
    return container


def _describe(data: Any) -> str:
    return type(data).__name__


def _describe_target(node: DictConfig) -> str:
    return str(node.get("_target_", "model")).rsplit(".", 1)[-1]


def _count(network: nn.Cell) -> str:
    return f"{sum(int(np.prod(p.shape)) for p in network.trainable_params()):,} parameters"


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
