"""What runs the built objects: the run directory, MindSpore's context, resume, and what a run reports.

The :class:`~trainkit.app.run_loop.Run` calls these around ``Model.train``; ``trainkit.app.build`` builds what they
run.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Dict, Optional

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from trainkit.app.config import MAX_MICRO_BATCHES
from trainkit.app.plan import StepPlan
from trainkit.app.resume_policy import check_resumable, restore
from trainkit.app.stopping import check_not_finished_early
from trainkit.callbacks import Evaluation, TrainMetrics
from trainkit.callbacks.early_stopping import MARKER as EARLY_STOP_MARKER
from trainkit.callbacks.evaluation import metric_name
from trainkit.checks import choice
from trainkit.data.array_batches import SAMPLER_ORDER, SHUFFLED_ORDER
from trainkit.errors import ConfigError, RunDirectoryInUse, naming_the_file
from trainkit.rundir.checkpoint_file import SavedCheckpoint, checkpoint_files, config_text, find_resume_checkpoint
from trainkit.rundir.command import hydra_config_of
from trainkit.step.wrapper import TrainingWrapper

log = logging.getLogger("trainkit")


# ------------------------------------------------------------------- the run directory and the context
def run_dir_of(cfg: DictConfig) -> Path:
    """``cfg.run_dir``, created and resolved; a clear error outside Hydra when it is not set."""
    try:
        run_dir = Path(cfg.run_dir)
    except InterpolationResolutionError as error:
        raise ConfigError("run_dir is not set: outside `python -m trainkit` pass run_dir=PATH "
                          "(compose_config([..., 'run_dir=PATH']))") from error
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir.resolve()


#: The folders of a run directory whose files a run writes by name (train.log, metrics.jsonl, .hydra/config.yaml, the
#: ``.tmp`` files renamed into place...): a link among them would be written through, to wherever it points.
WRITTEN_FOLDERS = (".", ".hydra", "checkpoints")


def check_no_file_links(run_dir: Path) -> None:
    """Refuse a run directory where a file a run writes could be a symbolic link (or a dangling one): appending to
    ``train.log`` or writing ``.hydra/config.yaml`` would write through it, outside the run. A link to a folder (a
    ``checkpoints`` folder on another disk) is allowed; its own files are checked."""
    for folder in WRITTEN_FOLDERS:
        path = run_dir / folder
        if not path.is_dir():
            continue
        for entry in os.scandir(path):
            if entry.is_symlink() and not entry.is_dir():  # is_dir() follows the link: a folder's link is allowed
                name = os.path.normpath(os.path.join(folder, entry.name))
                raise RunDirectoryInUse(
                    f"{run_dir / name} is a symbolic link (to {os.readlink(entry.path)}): a run writes its own files "
                    "in its directory and never through a link; nothing was changed there: remove the link or choose "
                    "a new directory with hydra.run.dir=PATH")


def check_run_dir_is_new(run_dir: Path, metrics_file: Optional[str]) -> None:
    """Refuse to mix two runs in one directory (``trainer.resume=auto`` continues the one there)."""
    earlier = [name for name in (".hydra/config.yaml", metrics_file, "tensorboard", "checkpoints")
               if name and (run_dir / name).exists()]
    if earlier:
        raise RunDirectoryInUse(f"{run_dir} already holds a run ({', '.join(earlier)}): nothing was changed there; "
                          "choose a new directory with hydra.run.dir=PATH (run_dir=PATH in-process), or continue "
                          "that run with trainer.resume=auto")


def save_config(cfg: DictConfig, run_dir: Path) -> str:
    """The composed config (and, under Hydra, its own config and the overrides) in ``.hydra/``, as Hydra would;
    returns the config's text, which the run's checkpoints store too.

    A resumed run keeps the first run's files and writes its own into ``.hydra/resume-<n>/``. The config is saved
    resolved (``${hydra:runtime.cwd}`` becomes the path): the tools read it where no Hydra app runs.
    """
    folder = run_dir / ".hydra"
    if (folder / "config.yaml").exists():
        number = 1
        while (folder / f"resume-{number}").exists():
            number += 1
        folder = folder / f"resume-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    text = config_text(cfg)  # what OmegaConf.save(cfg, ..., resolve=True) writes
    with naming_the_file(folder / "config.yaml"):
        (folder / "config.yaml").write_text(text, encoding="utf-8")
    hydra_cfg = hydra_config_of(run_dir)
    if hydra_cfg is not None:
        with naming_the_file(folder / "hydra.yaml"):
            OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), folder / "hydra.yaml")
        with naming_the_file(folder / "overrides.yaml"):
            OmegaConf.save(hydra_cfg.overrides.task, folder / "overrides.yaml")
    return text


def set_context(trainer: DictConfig, run_dir: Path) -> None:
    """Execution mode, device and every random seed from ``trainer``; MindSpore's compiler dumps into `run_dir`."""
    mode = ms.GRAPH_MODE if choice(trainer.mode) == "graph" else ms.PYNATIVE_MODE
    ms.set_context(mode=mode)
    os.environ["MS_OM_PATH"] = str(run_dir)  # rank_0/om/analyze_fail.ir of a failed compile: not into the cwd
    if trainer.device_target != "auto":
        try:
            ms.set_context(device_target=trainer.device_target)
        except (RuntimeError, ValueError) as error:
            reason = str(error).strip().splitlines()[0]  # MindSpore's message goes on for a screen
            raise ConfigError(f"trainer.device_target={trainer.device_target} is not available to this MindSpore "
                              f"build: use auto or {ms.get_context('device_target')} ({reason})") from error
    ms.set_seed(trainer.seed)
    ds.config.set_seed(trainer.seed)
    ds.config.set_fast_recovery(choice(trainer.resume_data) == "fast")
    np.random.seed(trainer.seed)
    random.seed(trainer.seed)


@contextlib.contextmanager
def inside(directory: Path):
    """Run the block with `directory` as the current directory."""
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)


# ------------------------------------------------------------------- steps, sinks and windows
def sink_size_of(trainer: DictConfig, steps_per_epoch: int) -> int:
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


def check_accumulation(plan: StepPlan) -> None:
    """A window must fit in the run; a last incomplete window is dropped, which is worth a warning."""
    micro_steps, k, steps_per_epoch = plan.micro_steps, plan.accumulation_steps, plan.steps_per_epoch
    if micro_steps > MAX_MICRO_BATCHES:
        raise ConfigError(f"trainer.epochs={plan.epochs} is not valid with {steps_per_epoch} steps per epoch: "
                          f"{micro_steps:,} micro-batches in all, and a run holds at most {MAX_MICRO_BATCHES:,} (its "
                          f"learning-rate table holds one number per update); use at most "
                          f"{MAX_MICRO_BATCHES // steps_per_epoch:,} epochs")
    if k > micro_steps:
        raise ConfigError(f"wrapper.accumulation_steps={k} is not valid for a run of {micro_steps} micro-batches "
                          f"({plan.epochs} epochs of {steps_per_epoch}): no window would complete, so "
                          f"nothing would train; use at most {micro_steps}")
    if micro_steps % k:
        log.warning("wrapper.accumulation_steps=%d: the last %d of %d micro-batches do not complete a window and "
                    "are not applied", k, micro_steps % k, micro_steps)


# ------------------------------------------------------------------- resume
def continues_run_dir(resume: Optional[str], run_dir: Path) -> bool:
    """Whether `trainer.resume` continues the run in `run_dir` (rather than starting one there)."""
    if resume is None:
        return False
    if resume == "auto":
        return True
    path = Path(resume).expanduser().resolve()
    return path == run_dir or run_dir in path.parents


def resume_checkpoint(cfg: DictConfig, run_dir: Path, wrapper: TrainingWrapper, plan: StepPlan,
                      group_size: int, learning_rates=None) -> Optional[SavedCheckpoint]:
    """Find, check and load the checkpoint `trainer.resume` names; None for a new run.

    `learning_rates(config)` gives the rate of every update under a config, for the continuation rule of
    :func:`trainkit.app.resume_policy.check_resumable` (more epochs when the updates taken keep their rates).
    """
    resume = cfg.trainer.resume
    if resume is None:
        return None
    checkpoint = find_resume_checkpoint(str(resume), run_dir)
    if checkpoint is None:
        log.info("trainer.resume=auto: no checkpoint in %s; starting a new run", run_dir / "checkpoints")
        return None
    check_resumable(checkpoint, cfg, wrapper, plan.steps_per_epoch, group_size, learning_rates)
    check_not_finished_early(checkpoint, run_dir)
    total = plan.micro_steps
    if checkpoint.position.micro_steps >= total:
        raise ConfigError(f"checkpoint {checkpoint.path} is at the end of the run ({checkpoint.position.micro_steps} "
                          f"of {total} micro-batches): nothing is left to train; its weights are ready to export "
                          "(python -m trainkit.export), or train it longer with a larger trainer.epochs (allowed when "
                          "the updates taken keep their learning rates)")
    restore(checkpoint, wrapper)
    return checkpoint


def warn_if_order_differs(resumed: SavedCheckpoint, data_order: str) -> None:
    """Say so when a checkpoint written mid-epoch drew its training order otherwise than this run does (a trainkit
    older than ``trainkit.data.array_batches``, or ``trainer.resume_data`` changed): the rest of the epoch then
    repeats some samples and leaves out others."""
    recorded = resumed.data_order or SAMPLER_ORDER
    if recorded == data_order:
        return
    fix = (f"resume with trainer.resume_data={'fast' if data_order == SHUFFLED_ORDER else 'exact'} to continue in "
           "the checkpoint's order")
    if recorded not in (SHUFFLED_ORDER, SAMPLER_ORDER):  # someone else's text: quoted, one line
        recorded, fix = repr(recorded[:200]), "no setting of this trainkit continues in that order"
    log.warning("checkpoint %s was written mid-epoch with the training order drawn by %s, and this run draws it by "
                "%s: the rest of epoch %d repeats some samples and leaves out others (the epochs after it are whole); "
                "%s", resumed.path, recorded, data_order,
                resumed.position.epoch + 1, fix)


def initial_epoch_of(done: int, steps_per_epoch: int, sink_size: int, resumed: Optional[SavedCheckpoint]) -> int:
    """``Model.train``'s ``initial_epoch`` for `done` micro-batches (in sinks when sinking: MindSpore's epochs)."""
    if sink_size > 0:
        if done % sink_size:
            raise ConfigError(f"checkpoint {resumed.path} is at micro-batch {done}, inside a sink of "
                              f"trainer.sink_size={sink_size}: resume it with trainer.dataset_sink_mode=false")
        return done // sink_size
    return done // steps_per_epoch


def set_aside_later_checkpoints(resumed: SavedCheckpoint) -> None:
    """Resuming from an older checkpoint of this run: move the newer ones aside (never delete them)."""
    files = checkpoint_files(resumed.path.parent)
    later = files[files.index(resumed.path) + 1:] if resumed.path in files else []
    later += [p for p in [resumed.path.parent / EARLY_STOP_MARKER] if p.exists()]  # it stopped later: stale now
    if not later:
        return
    folder = resumed.path.parent / time.strftime("superseded-%Y%m%d-%H%M%S")
    folder.mkdir()
    for path in later:
        path.rename(folder / path.name)
    log.warning("resuming from %s: moved the %d later checkpoints of this run to %s", resumed.path.name, len(later),
                folder)


def set_aside_earlier_attempt(checkpoints: Path) -> None:
    """A run starting anew where an earlier attempt left no checkpoint it can resume from: move what that attempt
    left in `checkpoints` (unreadable checkpoints, best.ckpt, best.json) aside, as a resume moves later checkpoints
    (never deleted; this run's own files would otherwise replace them)."""
    left = [p for p in sorted(checkpoints.iterdir()) if not p.name.startswith("superseded-")] \
        if checkpoints.is_dir() else []
    if not left:
        return
    folder = checkpoints / time.strftime("superseded-%Y%m%d-%H%M%S")
    folder.mkdir()
    for path in left:
        path.rename(folder / path.name)
    log.warning("starting a new run: moved the %d files of the earlier attempt's checkpoints to %s", len(left), folder)


# ------------------------------------------------------------------- reporting
def final_metrics(evaluation: Optional[Evaluation], metrics_cb: TrainMetrics, optimizer: nn.Optimizer,
                  elapsed: float, steps: int, samples_per_step: int) -> Dict[str, float]:
    """The last evaluation's metrics (``accuracy``, ``ema_loss``, ...) and the run's training figures."""
    latest = evaluation.latest if evaluation is not None else {}
    metrics = {metric_name(tag): float(value) for tag, value in latest.items() if "/" in tag}
    metrics.update({
        "train_loss": float(metrics_cb.last.get("train/loss", float("nan"))),
        "skipped_steps": float(metrics_cb.skipped_steps),
        "optimizer_steps": float(optimizer.global_step.asnumpy().item()),
        "train_seconds": elapsed,
        "samples_per_second": steps * samples_per_step / elapsed,
    })
    return metrics


def hyper_parameters(cfg: DictConfig) -> Dict[str, Any]:
    """The config as plain values for TensorBoard's HPARAMS tab."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    container.pop("run_dir", None)
    return container


def describe(data: Any) -> str:
    return type(data).__name__


def describe_target(node: DictConfig) -> str:
    return str(node.get("_target_", "model")).rsplit(".", 1)[-1]


def count_parameters(network: nn.Cell) -> str:
    """The startup line's count: the trainable parameters (``model.freeze``'s and batch-norm statistics left out)."""
    return f"{sum(int(np.prod(p.shape)) for p in network.trainable_params()):,} trainable parameters"


def describe_choice(cfg: DictConfig, group: str, run_dir: Path) -> str:
    """How a message names a group: ``loss=mse (mindspore.nn.MSELoss)`` under Hydra, ``loss (...)`` otherwise."""
    target = cfg[group].get("_target_")
    hydra_cfg = hydra_config_of(run_dir)
    option = hydra_cfg.runtime.choices.get(group) if hydra_cfg is not None else None
    return f"{group}={option} ({target})" if option else f"{group} ({target})"
