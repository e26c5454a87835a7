"""The Run: one training run's parts, built from its config and its plan, and the loop that trains them.

``train(cfg)`` (:mod:`trainkit.app.training`) checks the config, locks the run directory and makes a :class:`Run`.
Building it turns the config into a :class:`~trainkit.app.plan.RunPlan` once, as soon as the training set's size
is known, and builds every part with its checks (:mod:`trainkit.app.build`): the data, the network, the
optimizer, the wrapper, the callbacks, and the registry of stateful parts (:class:`StatefulParts`) every
checkpoint is assembled from and a resume restores. Bad input stops before anything is written into the run
directory. :meth:`Run.fit` then trains and reports, reading the plan and the parts, never the raw config.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from omegaconf import DictConfig

from trainkit.app import build, compile_cache, graph_reuse, run
from trainkit.app.finetune import apply_finetuning
from trainkit.app.fit_check import check_fit
from trainkit.app.plan import plan_run, step_plan
from trainkit.app.profiling import profile_window
from trainkit.app.stopping import continues_at, raise_if_interrupted, stop_metrics
from trainkit.app.testing import evaluate_test_set, wants_test
from trainkit.callbacks import BestCheckpoint, RunLog
from trainkit.callbacks.base import CallbackRun, bind_callbacks, learning_rate_table
from trainkit.checks import choice
from trainkit.data.array_batches import DATA_ORDER, order_of
from trainkit.data.values import checked_batches
from trainkit.distributed.agreement import check_ranks_agree
from trainkit.distributed.parallel import (
    describe_job,
    job_metrics,
    prepare_data,
    scaled_learning_rate,
    setup_parallel,
)
from trainkit.errors import ConfigError
from trainkit.process.signals import completing
from trainkit.rundir import held_log
from trainkit.rundir.class_names import class_names_of, save_class_names
from trainkit.rundir.data_state import FittedData, data_state_of, save_data_state
from trainkit.rundir.lock import RunDirectoryLock, held_by_launcher
from trainkit.rundir.random_state import unrestorable_random_layers
from trainkit.rundir.stateful_parts import StatefulParts
from trainkit.step.mixed_precision import applied_amp_level
from trainkit.step.wrapper import TrainingWrapper

log = logging.getLogger("trainkit")

#: The registry's name of the data module's fitted state (:class:`~trainkit.rundir.data_state.FittedData`).
DATA_PART = "data"


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


class Run:
    """One training run: built from a checked config (every check passed, the run directory written), then
    :meth:`fit` trains it.

    Attributes:
        plan: the resolved values the run goes by (:class:`~trainkit.app.plan.RunPlan`).
        parts: the registry of stateful parts (``data``, ``train_metrics``, ``best_checkpoint``,
            ``early_stopping``, ``callbacks/<Class>``): what every training checkpoint appends and a resume restores.
        data, wrapper, optimizer, model, callbacks: the parts built.
        resumed: the checkpoint this run continues, or None.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, lock: RunDirectoryLock):
        trainer = cfg.trainer
        run.set_context(trainer, run_dir)
        parallel = setup_parallel(cfg.parallel)
        self.parallel = parallel
        writer = parallel.writer  # the rank that writes config, metrics, events, progress and checkpoints
        if writer and not lock.held and not held_by_launcher(run_dir):
            lock.acquire()
        continuing = run.continues_run_dir(trainer.resume, run_dir)
        if writer:
            run.check_no_file_links(run_dir)
            if not continuing:
                run.check_run_dir_is_new(run_dir, cfg.logger.metrics_file)
        self.parts = StatefulParts()
        self._build_data(cfg)
        steps_per_epoch = self.train_set.get_dataset_size()
        if steps_per_epoch < 1:
            raise ConfigError(f"data.batch_size={cfg.data.get('batch_size')} is larger than the training set "
                              f"({run.describe(self.data)}): no full batch per epoch")
        steps = step_plan(cfg, steps_per_epoch, run.sink_size_of(trainer, steps_per_epoch), parallel.group_size)
        run.check_accumulation(steps)
        self.plan = plan = plan_run(cfg, run_dir, steps, parallel, continuing, test=self.test_set is not None)
        # trainer.profile: checked here, runs as a callback
        self.profiler = profile_window(cfg, run_dir, plan.rank, steps.sink_size)
        self._build_network(cfg)
        self.resumed = self._resume(cfg)
        restored = build.restore_before_writing(self.resumed, self.parts) if self.resumed else ()
        lock.commit()  # every check passed: only now write into the run directory (bad input leaves no trace)
        config_text = self._write_run_dir(cfg)
        self.hyper_parameters = run.hyper_parameters(cfg)  # TensorBoard's HPARAMS tab, at the end
        self._build_callbacks(config_text, restored)
        self._announce(cfg)

    # ------------------------------------------------------------------ building (reads the config)
    def _build_data(self, cfg: DictConfig) -> None:
        """The data module, its fitted state (registered: ``data``) and its datasets, each checked."""
        parallel = self.parallel
        data = self.data = build.instantiate_group("data", cfg.data)
        prepare_data(data, parallel)  # rank 0 first: only one process per machine downloads
        # What the data learnt of the training split (a table's statistics) and its class names: stored in the run
        # and in every checkpoint (predictions need no training file), and checked again by a resume.
        self.fitted = FittedData(run.describe(data), data_state_of(data), class_names_of(data))
        self.parts.register(DATA_PART, self.fitted)
        train_set = data.train_dataset(num_shards=parallel.group_size, shard_id=parallel.rank)
        self.data_order = order_of(train_set)  # before any wrapping: what checkpoints record (DATA_ORDER)
        self.batch_check = None
        if not getattr(data, "values_checked", False):  # a module that streams: its first epoch, batch by batch
            classes = getattr(data, "num_classes", None)
            train_set, self.batch_check = checked_batches(train_set, f"{run.describe(data)}.train_dataset()",
                                                          classes if isinstance(classes, int) else None)
        self.train_set = train_set
        self.eval_set = data.eval_dataset()  # the whole set on every rank: a sharded one is padded with repeats
        # held out: tested once, with best.ckpt
        self.test_set = data.test_dataset() if wants_test(cfg, data) else None

    def _build_network(self, cfg: DictConfig) -> None:
        """The model, loss, metrics, user callbacks, optimizer, wrapper and ``Model``, each checked."""
        plan, data, batch_check = self.plan, self.data, self.batch_check
        backbone = build.build_model(cfg, data)
        apply_finetuning(cfg.model, backbone, plan.resume)  # model.pretrained, model.freeze: before the optimizer
        loss_fn = build.build_loss_fn(cfg)
        metrics = build.build_metrics(cfg)
        # the shapes the data gave: a folder of their own
        compile_cache.settle(backbone, plan.steps.steps_per_epoch, self.eval_set)
        outputs = check_fit(backbone, loss_fn, self.eval_set, run.describe_choice(cfg, "loss", plan.run_dir),
                            run.describe_choice(cfg, "model", plan.run_dir), metrics,
                            getattr(data, "num_classes", None),
                            passed_in=compile_cache.active_folder())  # a second run of this config: passed before
        if batch_check is not None and batch_check.num_classes is None and outputs is not None:
            batch_check.num_classes = outputs  # a module without num_classes: labels in [0, the model's outputs)
            batch_check.classes_from = f"the model has {outputs} outputs; the data module gives no num_classes"
        self.user_callbacks = build.build_user_callbacks(cfg)
        for name, callback in build.user_parts(self.user_callbacks):
            self.parts.register(name, callback)
        # state_dict() gives JSON data, said before anything compiles
        build.check_user_callback_states(self.user_callbacks)
        with run.inside(plan.run_dir):  # MindSpore's O1 rewrite writes rewritten_network/ into the current directory
            loss_network = build.build_loss_network_for(cfg, backbone, loss_fn)
        self.lr = scaled_learning_rate(cfg.optimizer.lr, cfg.parallel, self.parallel)
        learning_rates = build.build_learning_rates(cfg, self.lr, plan.steps.steps_per_epoch,
                                                    plan.steps.accumulation_steps)
        optimizer = build.build_optimizer(cfg, backbone, learning_rates)
        wrapper = build.build_wrapper(cfg, loss_network, optimizer)
        # A sweep's earlier job in this process compiled the same graphs: train its cells, with this job's values.
        cells = graph_reuse.reuse(graph_reuse.CompiledCells(backbone, loss_network, optimizer, wrapper,
                                                            build.build_eval_network(loss_network, loss_fn, metrics)))
        self.backbone, self.loss_network = cells.backbone, cells.loss_network
        self.optimizer, self.wrapper = cells.optimizer, cells.wrapper
        self.model = build.build_model_runner(self.wrapper, cells.eval_network, metrics)

    def _resume(self, cfg: DictConfig):
        """Load the checkpoint ``trainer.resume`` names (checked against this run), or None for a new run."""
        plan = self.plan
        steps_per_epoch = plan.steps.steps_per_epoch

        def learning_rates(config: DictConfig) -> List[float]:  # of every update under `config` (continuation rule)
            rate = scaled_learning_rate(config.optimizer.lr, config.parallel, self.parallel)
            return build.build_learning_rates(config, rate, steps_per_epoch, config.wrapper.accumulation_steps)

        resumed = run.resume_checkpoint(cfg, plan.run_dir, self.wrapper, plan.steps, plan.group_size,
                                        learning_rates)
        self.done = resumed.position.micro_steps if resumed else 0
        self.initial_epoch = run.initial_epoch_of(self.done, steps_per_epoch, plan.steps.sink_size, resumed)
        # same step, weights, optimizer state and config everywhere
        check_ranks_agree(self.done, self.wrapper, cfg, plan.group_size)
        return resumed

    def _write_run_dir(self, cfg: DictConfig) -> Optional[str]:
        """The run directory's files (the config, class names, data state); returns the config's text, which
        every checkpoint stores too (None off the writer, which writes no checkpoint)."""
        plan, resumed = self.plan, self.resumed
        saved_config = None
        held_log.release()  # the lines held since start-up (python -m trainkit) go into train.log
        if plan.writer:
            with completing():  # a signal now ends the process after these moves and writes, not half-way
                if resumed and resumed.path.parent == plan.checkpoints:
                    run.set_aside_later_checkpoints(resumed)
                elif not resumed and plan.continues_run_dir:
                    run.set_aside_earlier_attempt(plan.checkpoints)
                saved_config = run.save_config(cfg, plan.run_dir)
                if self.fitted.class_names is not None:
                    save_class_names(plan.run_dir, self.fitted.class_names)
                if self.fitted.state is not None:
                    save_data_state(plan.run_dir, self.fitted.state)
        return saved_config

    # ------------------------------------------------------------------ the callbacks (read the plan)
    def _build_callbacks(self, config_text: Optional[str], restored: Sequence[str]) -> None:
        plan, resumed, done = self.plan, self.resumed, self.done
        if resumed and resumed.position.step_in_epoch:
            run.warn_if_order_differs(resumed, self.data_order)
        if done:
            self.train_set.set_init_step(done)  # Model.train then continues the data mid-epoch from the checkpoint
            if plan.replay_data:
                log.info("replaying the data pipeline through %d micro-batches so augmentations match exactly "
                         "(trainer.resume_data=fast skips the replay)", done)
        self.run_log = RunLog(plan.run_dir, tensorboard=plan.tensorboard, metrics_file=plan.metrics_file,
                              continues_at=continues_at(resumed, plan.run_dir, plan.continues_run_dir)
                              if plan.writer else None,  # the records after it leave the main record
                              accumulation_steps=plan.steps.accumulation_steps)
        if self.run_log.superseded is not None:
            log.warning("the records an earlier attempt made %s were moved to %s: this run records them again",
                        f"after step {done}" if resumed else "in this directory", self.run_log.superseded)
        metadata = {**build.checkpoint_metadata(self.fitted), DATA_ORDER: self.data_order}
        self.hooks = build.build_callbacks(plan, self.run_log, self.model, self.wrapper, self.eval_set, resumed,
                                           self.user_callbacks, self.parts, metadata, config_text,
                                           extra=self.profiler)
        if resumed:  # every stateful part continues from the checkpoint: early stopping, best.ckpt, the records
            stored = dict(resumed.parts or {})
            if not plan.writer:  # best.ckpt is the writer's: the other ranks keep no best so far
                stored.pop("best_checkpoint", None)
            self.parts.load(stored, f"checkpoint {resumed.path}", skip=restored)
        bind_callbacks(self.user_callbacks, CallbackRun(
            run_log=self.run_log if plan.writer else None, network=self.backbone, wrapper=self.wrapper,
            optimizer=self.optimizer, learning_rates=learning_rate_table(self.optimizer), run_dir=plan.run_dir,
            rank=plan.rank, writer=plan.writer, steps_per_epoch=plan.steps.steps_per_epoch,
            accumulation_steps=plan.steps.accumulation_steps, evaluation=self.hooks.evaluation))

    @property
    def callbacks(self) -> List[ms.train.Callback]:
        """The run's callbacks in the order they run."""
        return self.hooks.callbacks

    def _announce(self, cfg: DictConfig) -> None:
        plan, steps = self.plan, self.plan.steps
        log.info("%s: %s on %s, %d steps/epoch of %d samples (%d per rank x %d), %d epochs, %s mode, amp %s, "
                 "run dir %s", run.describe_target(cfg.model), run.count_parameters(self.backbone),
                 run.describe(self.data), steps.steps_per_epoch, steps.samples_per_step, plan.samples_per_rank,
                 plan.group_size, steps.epochs, choice(cfg.trainer.mode),
                 applied_amp_level(self.loss_network.backbone), plan.run_dir)
        if not plan.stand_alone:
            log.info("%s", describe_job(cfg.parallel, self.parallel, plan.samples_per_rank, steps.accumulation_steps,
                                        cfg.optimizer.lr, self.lr))
        if self.resumed:
            epoch, in_epoch = steps.position_of(self.done)
            log.info("resuming from %s: epoch %d, step %d of %d in it (%d micro-batches done, %d optimizer steps)",
                     self.resumed.path, epoch, in_epoch, steps.steps_per_epoch, self.done,
                     int(self.optimizer.global_step.asnumpy().item()))
            random_layers = unrestorable_random_layers(self.backbone)
            if random_layers:
                log.warning("resume is not exact: %s draw random numbers from MindSpore kernels whose state a "
                            "checkpoint cannot hold, so their streams (dropout masks) restart; the weights, "
                            "optimizer, data order and everything else continue exactly", ", ".join(random_layers))

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainResult:
        """Train to the plan's end (or a stop), then evaluate the test set and report the final metrics."""
        plan, steps, hooks, run_log = self.plan, self.plan.steps, self.hooks, self.run_log
        start = time.perf_counter()
        try:
            try:
                self.model.train(steps.model_epochs, self.train_set, callbacks=hooks.callbacks,
                                 dataset_sink_mode=plan.dataset_sink_mode, sink_size=steps.sink_size,
                                 initial_epoch=self.initial_epoch)
            except RuntimeError as error:  # a bad batch of a streaming source: MindSpore's many lines, said in one
                if self.batch_check is not None and self.batch_check.problem is not None:
                    raise self.batch_check.problem from error
                raise
            # a signal: RunInterrupted, 128 + signal
            raise_if_interrupted(hooks.callbacks, plan.run_dir, steps.steps_per_epoch)
            elapsed = time.perf_counter() - start
            metrics = run.final_metrics(hooks.evaluation, hooks.train_metrics, self.optimizer, elapsed,
                                        steps.micro_steps - self.done, steps.samples_per_step)
            metrics["amp_level"] = float(applied_amp_level(self.loss_network.backbone)[1])  # 2.0: O2 ran
            metrics.update(stop_metrics(hooks.callbacks))  # early stopping: best_epoch, stopped_epoch
            if self.test_set is not None:
                metrics.update(self._test(run_log))
            if not plan.stand_alone:
                metrics.update(job_metrics(self.parallel, plan.samples_per_rank, steps.accumulation_steps))
            with completing():
                run_log.hparams(self.hyper_parameters, {f"final/{k}": v for k, v in metrics.items()})
        finally:
            with completing():  # the event files and metrics.jsonl closed whole before a signal ends the process
                run_log.close()
        log.info("finished: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        return TrainResult(metrics, plan.run_dir, self.model, self.wrapper, self.loss_network.backbone,
                           self.optimizer, self.data, hooks.callbacks)

    def _test(self, run_log: RunLog) -> Dict[str, float]:
        """The held-out test set, with best.ckpt's weights (``trainer.test``)."""
        hooks = self.hooks
        last = hooks.evaluation.latest if hooks.evaluation is not None else {}
        best = next((c for c in hooks.callbacks if isinstance(c, BestCheckpoint)), None)
        return evaluate_test_set(self.model, self.wrapper, self.test_set, self.plan.checkpoints / "best.ckpt",
                                 last.get("step", self.plan.steps.micro_steps), last.get("epoch"), run_log,
                                 best_in_memory=best is not None and best.holds_last_state)
