"""The run's plan: the config turned, once, into resolved and checked values, and the step arithmetic on them.

``train(cfg)`` makes a :class:`RunPlan` as soon as the training set's size is known (:func:`plan_run`): how many
micro-batches, updates, epochs and sinks (:class:`StepPlan`), the paths, this process's place in the job, and
which parts to build (evaluation, checkpoints, ``best.ckpt``, early stopping, progress, the test set). The
:class:`~trainkit.app.run_loop.Run` and the callbacks it builds read the plan; nothing below the app reads the raw
config, and nothing else multiplies ``trainer.epochs`` by ``steps_per_epoch`` again.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Tuple

from omegaconf import DictConfig

from trainkit.app.config import best_metric, best_mode
from trainkit.checks import choice


@dataclass(frozen=True)
class StepPlan:
    """Resolved, checked counts of one run.

    Attributes:
        epochs: ``trainer.epochs``.
        steps_per_epoch: micro-batches per epoch on one rank (the training set's batches).
        accumulation_steps: micro-batches per optimizer update (``wrapper.accumulation_steps``).
        sink_size: micro-batches per sink (``trainer.sink_size`` as applied); 0 or less: no sinking.
        samples_per_step: samples in one micro-batch over every rank (``data.batch_size`` x ranks).
    """

    epochs: int
    steps_per_epoch: int
    accumulation_steps: int = 1
    sink_size: int = -1
    samples_per_step: int = 1

    @property
    def micro_steps(self) -> int:
        """Micro-batches in the whole run."""
        return self.epochs * self.steps_per_epoch

    @property
    def updates(self) -> int:
        """Optimizer updates in the whole run (a last incomplete window applies none)."""
        return self.micro_steps // self.accumulation_steps

    @property
    def sinks_per_epoch(self) -> int:
        """``Model.train``'s "epochs" per real epoch: with a sink size it counts each sink as one."""
        return self.steps_per_epoch // self.sink_size if self.sink_size > 0 else 1

    @property
    def model_epochs(self) -> int:
        """The epoch count ``Model.train`` is given."""
        return self.epochs * self.sinks_per_epoch

    @property
    def steps_per_model_epoch(self) -> int:
        """Micro-batches in one of ``Model.train``'s epochs: a sink when sinking, else an epoch."""
        return self.sink_size if self.sink_size > 0 else self.steps_per_epoch

    def model_epochs_every(self, epochs: int) -> int:
        """``Model.train``'s epochs in `epochs` real ones; 0 (``trainer.eval_interval=0``): the whole run."""
        return epochs * self.sinks_per_epoch if epochs else self.model_epochs

    def position_of(self, micro_steps: int) -> Tuple[int, int]:
        """(epoch from 1, micro-batches done in it) after `micro_steps` micro-batches, as a resume says it."""
        return micro_steps // self.steps_per_epoch + 1, micro_steps % self.steps_per_epoch


@dataclass(frozen=True)
class EarlyStoppingPlan:
    """``trainer.early_stopping`` resolved: the evaluation's tag it follows and its mode."""

    metric: str  # eval/loss, eval_ema/accuracy, ...
    mode: str  # min or max
    patience: int
    min_delta: float


@dataclass(frozen=True)
class RunPlan:
    """Everything a run decided from its config, resolved and checked: what the Run and its callbacks read.

    Attributes:
        run_dir: the run directory (resolved).
        steps: the step arithmetic.
        rank, group_size, writer: this process's place in the job; the writer writes the run's files.
        stand_alone: ``parallel.mode=stand_alone``.
        resume: ``trainer.resume``; continues_run_dir: it continues the run in `run_dir`.
        replay_data: ``trainer.resume_data=exact``: a resume replays the pipeline to the checkpoint's step.
        dataset_sink_mode: ``trainer.dataset_sink_mode``.
        evaluate: ``trainer.evaluate``; eval_interval: epochs between evaluations (0: after the last only).
        test: the held-out test set is evaluated at the end (``trainer.test`` against the data).
        save_checkpoints, checkpoint_every_n_steps, keep_checkpoints: the training checkpoints.
        best_metric, best_mode: the evaluation tag ``best.ckpt`` follows and whether higher is better.
        early_stopping: None when off.
        max_nonfinite_steps: skipped updates in a row that stop a run without loss scaling (0: never).
        progress, log_every_n_steps, metrics_file, tensorboard: the records (the last two None/False off the writer).
    """

    run_dir: Path
    steps: StepPlan
    rank: int = 0
    group_size: int = 1
    writer: bool = True
    stand_alone: bool = True
    resume: Optional[str] = None
    continues_run_dir: bool = False
    replay_data: bool = True
    dataset_sink_mode: bool = False
    evaluate: bool = True
    eval_interval: int = 1
    test: bool = False
    save_checkpoints: bool = True
    checkpoint_every_n_steps: int = 0
    keep_checkpoints: int = 3
    best_metric: str = "eval/accuracy"
    best_mode: str = "max"
    early_stopping: Optional[EarlyStoppingPlan] = None
    max_nonfinite_steps: int = 0
    progress: str = "auto"
    log_every_n_steps: int = 10
    metrics_file: Optional[str] = "metrics.jsonl"
    tensorboard: bool = True

    @property
    def checkpoints(self) -> Path:
        """The folder of the run's checkpoints, ``best.ckpt`` and ``best.json``."""
        return self.run_dir / "checkpoints"

    @property
    def eval_every(self) -> int:
        """``Model.train``'s epochs between evaluations (the Evaluation callback's interval)."""
        return self.steps.model_epochs_every(self.eval_interval)

    @property
    def samples_per_rank(self) -> int:
        """Samples in one rank's micro-batch."""
        return self.steps.samples_per_step // self.group_size

    @property
    def best_checkpoint(self) -> bool:
        """Whether this process keeps ``best.ckpt``."""
        return self.writer and self.evaluate and self.save_checkpoints


def step_plan(cfg: DictConfig, steps_per_epoch: int, sink_size: int, group_size: int) -> StepPlan:
    """The step arithmetic of `cfg` for a training set of `steps_per_epoch` batches (`sink_size` as applied)."""
    return StepPlan(epochs=int(cfg.trainer.epochs), steps_per_epoch=steps_per_epoch,
                    accumulation_steps=int(cfg.wrapper.accumulation_steps), sink_size=sink_size,
                    samples_per_step=int(cfg.data.get("batch_size", 1)) * group_size)


def plan_run(cfg: DictConfig, run_dir: Path, steps: StepPlan, parallel: Any, continues_run_dir: bool,
             test: bool) -> RunPlan:
    """The plan of a checked config (``check_config``) for this process of the job (`parallel`: rank, group_size,
    writer), its step arithmetic `steps` and whether the test set is evaluated."""
    from trainkit.callbacks.evaluation import eval_tag  # here: the plan's module imports no MindSpore (unit tests)

    trainer, logger, writer = cfg.trainer, cfg.logger, bool(parallel.writer)
    early = trainer.early_stopping
    stopping = None
    if early.metric is not None:
        stopping = EarlyStoppingPlan(eval_tag(str(early.metric)), best_mode(str(early.metric), early.mode),
                                     int(early.patience), float(early.min_delta))
    best = best_metric(cfg)
    return RunPlan(
        run_dir=Path(run_dir), steps=steps, rank=int(parallel.rank), group_size=int(parallel.group_size),
        writer=writer, stand_alone=choice(cfg.parallel.mode) == "stand_alone",
        resume=None if trainer.resume is None else str(trainer.resume), continues_run_dir=continues_run_dir,
        replay_data=choice(trainer.resume_data) == "exact", dataset_sink_mode=bool(trainer.dataset_sink_mode),
        evaluate=bool(trainer.evaluate), eval_interval=int(trainer.eval_interval), test=bool(test),
        save_checkpoints=bool(trainer.save_checkpoints),
        checkpoint_every_n_steps=int(trainer.checkpoint_every_n_steps), keep_checkpoints=int(trainer.keep_checkpoints),
        best_metric=eval_tag(best), best_mode=best_mode(best, trainer.best_mode), early_stopping=stopping,
        max_nonfinite_steps=int(trainer.max_nonfinite_steps or 0), progress=choice(logger.progress),
        log_every_n_steps=int(logger.log_every_n_steps), metrics_file=logger.metrics_file if writer else None,
        tensorboard=bool(logger.tensorboard) and writer)
