"""``train(cfg)``: build everything a config describes, check it, train with ``mindspore.train.Model``.

Everything that can be wrong in the input -- values, data files, the model's and the data's
shapes -- is checked before the first step compiles. ``python -m trainkit`` is a thin Hydra main
around this function; scripts and tests call it in-process::

    from trainkit.app import train
    from trainkit.app.config import compose_config
    result = train(compose_config(["recipe=digits_quickstart", "run_dir=/tmp/run"]))
    result.metrics["accuracy"]

``trainkit.app.build`` builds the parts (with their checks), ``trainkit.app.run`` holds what runs them (run directory,
context, resume, reporting); ``train`` below is the outline of a run.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from omegaconf import DictConfig

from trainkit.app import build, compile_cache, graph_reuse, run
from trainkit.app.config import check_config
from trainkit.app.finetune import apply_finetuning
from trainkit.app.fit_check import check_fit
from trainkit.app.plan import StepPlan
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
    launched_by_msrun,
    prepare_data,
    scaled_learning_rate,
    setup_parallel,
)
from trainkit.errors import ConfigError
from trainkit.process.signals import completing
from trainkit.rundir import held_log
from trainkit.rundir.class_names import class_names_of, save_class_names
from trainkit.rundir.data_state import data_state_of, save_data_state
from trainkit.rundir.lock import RunDirectoryLock, held_by_launcher
from trainkit.rundir.random_state import unrestorable_random_layers
from trainkit.step.mixed_precision import applied_amp_level
from trainkit.step.wrapper import TrainingWrapper

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
    # 1. Check the config, lock the run directory, set up the context and the processes; refuse a directory that
    # holds another run, live (the lock) or finished.
    check_config(cfg)
    run_dir = run.run_dir_of(cfg)
    with RunDirectoryLock(run_dir) as lock:  # released when the run ends, however it ends
        if not launched_by_msrun():
            lock.acquire()  # before anything is written; under msrun rank 0 takes it below, or the launcher has it
        return _train(cfg, run_dir, lock)


def _train(cfg: DictConfig, run_dir: Path, lock: RunDirectoryLock) -> TrainResult:
    trainer = cfg.trainer
    run.set_context(trainer, run_dir)
    parallel = setup_parallel(cfg.parallel)
    rank, group_size = parallel.rank, parallel.group_size
    writer = parallel.writer  # the rank that writes config, metrics, events, progress and checkpoints
    if writer and not lock.held and not held_by_launcher(run_dir):
        lock.acquire()
    if writer:
        run.check_no_file_links(run_dir)
        if not run.continues_run_dir(trainer.resume, run_dir):
            run.check_run_dir_is_new(run_dir, cfg.logger.metrics_file)

    # 2. Build the parts, each checked as it is built.
    data = build.instantiate_group("data", cfg.data)
    prepare_data(data, parallel)  # rank 0 first: only one process per machine downloads
    class_names = class_names_of(data)  # stored in the run and its checkpoints: predictions name the classes
    state = data_state_of(data)  # what the data learnt of the training split (a table's statistics): the same
    train_set = data.train_dataset(num_shards=group_size, shard_id=rank)
    data_order = order_of(train_set)  # before any wrapping: what checkpoints record (DATA_ORDER)
    batch_check = None
    if not getattr(data, "values_checked", False):  # a module that streams: its first epoch, batch by batch
        classes = getattr(data, "num_classes", None)
        train_set, batch_check = checked_batches(train_set, f"{run.describe(data)}.train_dataset()",
                                                 classes if isinstance(classes, int) else None)
    eval_set = data.eval_dataset()  # the whole set on every rank: a sharded one is padded with repeats
    test_set = data.test_dataset() if wants_test(cfg, data) else None  # held out: tested once, with best.ckpt
    steps_per_epoch = train_set.get_dataset_size()
    if steps_per_epoch < 1:
        raise ConfigError(f"data.batch_size={cfg.data.get('batch_size')} is larger than the training set "
                          f"({run.describe(data)}): no full batch per epoch")
    sink_size = run.sink_size_of(trainer, steps_per_epoch)
    plan = StepPlan(epochs=int(trainer.epochs), steps_per_epoch=steps_per_epoch,
                    accumulation_steps=int(cfg.wrapper.accumulation_steps), sink_size=sink_size,
                    samples_per_step=int(cfg.data.get("batch_size", 1)) * group_size)
    run.check_accumulation(plan)
    profiler = profile_window(cfg, run_dir, rank, sink_size)  # trainer.profile: checked here, runs as a callback
    backbone = build.build_model(cfg, data)
    # model.pretrained, model.freeze: before the optimizer takes the params
    apply_finetuning(cfg.model, backbone, trainer.resume)
    loss_fn = build.build_loss_fn(cfg)
    metrics = build.build_metrics(cfg)
    compile_cache.settle(backbone, steps_per_epoch, eval_set)  # the shapes the data gave: a folder of their own
    outputs = check_fit(backbone, loss_fn, eval_set, run.describe_choice(cfg, "loss", run_dir),
                        run.describe_choice(cfg, "model", run_dir), metrics, getattr(data, "num_classes", None),
                        passed_in=compile_cache.active_folder())  # a second run of this config: passed before
    if batch_check is not None and batch_check.num_classes is None and outputs is not None:
        batch_check.num_classes = outputs  # a module without num_classes: labels in [0, the model's outputs)
        batch_check.classes_from = f"the model has {outputs} outputs; the data module gives no num_classes"
    user_callbacks = build.build_user_callbacks(cfg)
    build.check_user_callback_states(user_callbacks)  # state_dict() gives JSON data, said before anything compiles
    with run.inside(run_dir):  # MindSpore's O1 rewrite writes rewritten_network/ into the current directory
        loss_network = build.build_loss_network_for(cfg, backbone, loss_fn)
    accumulation_steps = cfg.wrapper.accumulation_steps
    lr = scaled_learning_rate(cfg.optimizer.lr, cfg.parallel, parallel)
    learning_rates = build.build_learning_rates(cfg, lr, steps_per_epoch, accumulation_steps)
    optimizer = build.build_optimizer(cfg, backbone, learning_rates)
    wrapper = build.build_wrapper(cfg, loss_network, optimizer)
    # A sweep's earlier job in this process compiled the same graphs: train its cells, with this job's values.
    cells = graph_reuse.reuse(graph_reuse.CompiledCells(backbone, loss_network, optimizer, wrapper,
                                                        build.build_eval_network(loss_network, loss_fn, metrics)))
    backbone, loss_network, optimizer, wrapper = cells.backbone, cells.loss_network, cells.optimizer, cells.wrapper
    model = build.build_model_runner(wrapper, cells.eval_network, metrics)

    # 3. Resume: load the checkpoint and find where the data continues.
    def learning_rates(config: DictConfig) -> List[float]:  # of every update under `config` (the continuation rule)
        rate = scaled_learning_rate(config.optimizer.lr, config.parallel, parallel)
        return build.build_learning_rates(config, rate, steps_per_epoch, config.wrapper.accumulation_steps)

    resumed = run.resume_checkpoint(cfg, run_dir, wrapper, plan, group_size, learning_rates)
    done = resumed.position.micro_steps if resumed else 0
    initial_epoch = run.initial_epoch_of(done, steps_per_epoch, sink_size, resumed)
    check_ranks_agree(done, wrapper, cfg, group_size)  # same step, weights, optimizer state and config everywhere

    restored_users = build.restore_before_writing(resumed, user_callbacks) if resumed else ()

    # 4. Every check passed: only now write into the run directory (bad input leaves no trace there).
    lock.commit()
    saved_config = None  # the config's text, once .hydra/config.yaml holds it: every checkpoint stores the same
    held_log.release()  # the lines held since start-up (python -m trainkit) go into train.log
    if writer:
        with completing():  # a signal now ends the process after these moves and writes, not half-way
            if resumed and resumed.path.parent == run_dir / "checkpoints":
                run.set_aside_later_checkpoints(resumed)
            elif not resumed and run.continues_run_dir(trainer.resume, run_dir):
                run.set_aside_earlier_attempt(run_dir / "checkpoints")
            saved_config = run.save_config(cfg, run_dir)
            if class_names is not None:
                save_class_names(run_dir, class_names)
            if state is not None:
                save_data_state(run_dir, state)
    if resumed and resumed.position.step_in_epoch:
        run.warn_if_order_differs(resumed, data_order)
    if done:
        train_set.set_init_step(done)  # Model.train then continues the data mid-epoch where the checkpoint left it
        if choice(trainer.resume_data) == "exact":
            log.info("replaying the data pipeline through %d micro-batches so augmentations match exactly "
                     "(trainer.resume_data=fast skips the replay)", done)
    samples_per_step = plan.samples_per_step
    model_epochs = plan.model_epochs  # with sink_size, Model.train counts each sink as an "epoch"
    run_log = RunLog(run_dir, tensorboard=cfg.logger.tensorboard and writer,
                     metrics_file=cfg.logger.metrics_file if writer else None,
                     continues_at=continues_at(resumed, run_dir, run.continues_run_dir(trainer.resume, run_dir))
                     if writer else None,  # the records after it leave the main record
                     accumulation_steps=accumulation_steps)
    if run_log.superseded is not None:
        log.warning("the records an earlier attempt made %s were moved to %s: this run records them again",
                    f"after step {done}" if resumed else "in this directory", run_log.superseded)
    hooks = build.build_callbacks(cfg, writer, run_dir, run_log, model, wrapper, eval_set, resumed,
                                  steps_per_epoch, sink_size, samples_per_step, group_size, user_callbacks,
                                  {**build.checkpoint_metadata(data), DATA_ORDER: data_order}, saved_config)
    hooks.callbacks.extend(profiler)
    if resumed:  # every stateful part continues from the checkpoint: early stopping, the records, user callbacks
        hooks.parts.load(resumed.parts, f"checkpoint {resumed.path}", skip=restored_users)
    bind_callbacks(user_callbacks, CallbackRun(
        run_log=run_log if writer else None, network=backbone, wrapper=wrapper, optimizer=optimizer,
        learning_rates=learning_rate_table(optimizer), run_dir=run_dir, rank=rank, writer=writer,
        steps_per_epoch=steps_per_epoch, accumulation_steps=accumulation_steps, evaluation=hooks.evaluation))

    log.info("%s: %s on %s, %d steps/epoch of %d samples (%d per rank x %d), %d epochs, %s mode, amp %s, run dir %s",
             run.describe_target(cfg.model), run.count_parameters(backbone), run.describe(data), steps_per_epoch,
             samples_per_step, samples_per_step // group_size, group_size, trainer.epochs, choice(trainer.mode),
             applied_amp_level(loss_network.backbone), run_dir)
    if choice(cfg.parallel.mode) != "stand_alone":
        log.info("%s", describe_job(cfg.parallel, parallel, samples_per_step // group_size, accumulation_steps,
                                    cfg.optimizer.lr, lr))
    if resumed:
        log.info("resuming from %s: epoch %d, step %d of %d in it (%d micro-batches done, %d optimizer steps)",
                 resumed.path, done // steps_per_epoch + 1, done % steps_per_epoch, steps_per_epoch, done,
                 int(optimizer.global_step.asnumpy().item()))
        random_layers = unrestorable_random_layers(backbone)
        if random_layers:
            log.warning("resume is not exact: %s draw random numbers from MindSpore kernels whose state a checkpoint "
                        "cannot hold, so their streams (dropout masks) restart; the weights, optimizer, data order "
                        "and everything else continue exactly", ", ".join(random_layers))

    # 5. Train, then report.
    start = time.perf_counter()
    try:
        try:
            model.train(model_epochs, train_set, callbacks=hooks.callbacks,
                        dataset_sink_mode=trainer.dataset_sink_mode, sink_size=sink_size, initial_epoch=initial_epoch)
        except RuntimeError as error:  # a bad batch of a streaming source: MindSpore's many lines, said in one
            if batch_check is not None and batch_check.problem is not None:
                raise batch_check.problem from error
            raise
        raise_if_interrupted(hooks.callbacks, run_dir, steps_per_epoch)  # a signal: RunInterrupted, 128 + signal
        elapsed = time.perf_counter() - start
        metrics = run.final_metrics(hooks.evaluation, hooks.train_metrics, optimizer, elapsed,
                                    plan.micro_steps - done, samples_per_step)
        metrics["amp_level"] = float(applied_amp_level(loss_network.backbone)[1])  # 2.0: O2 ran
        metrics.update(stop_metrics(hooks.callbacks))  # early stopping: best_epoch, stopped_epoch
        if test_set is not None:
            last = hooks.evaluation.latest if hooks.evaluation is not None else {}
            best = next((c for c in hooks.callbacks if isinstance(c, BestCheckpoint)), None)
            metrics.update(evaluate_test_set(model, wrapper, test_set, run_dir / "checkpoints" / "best.ckpt",
                                             last.get("step", plan.micro_steps), last.get("epoch"),
                                             run_log, best_in_memory=best is not None and best.holds_last_state))
        if choice(cfg.parallel.mode) != "stand_alone":
            metrics.update(job_metrics(parallel, samples_per_step // group_size, accumulation_steps))
        with completing():
            run_log.hparams(run.hyper_parameters(cfg), {f"final/{k}": v for k, v in metrics.items()})
    finally:
        with completing():  # the event files and metrics.jsonl closed whole before a signal ends the process
            run_log.close()
    log.info("finished: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    return TrainResult(metrics, run_dir, model, wrapper, loss_network.backbone, optimizer, data, hooks.callbacks)

