"""The resume policy: whether a training checkpoint may continue this run, and loading it into the network.

A resume continues the run the checkpoint belongs to, so the config may change whatever leaves the steps already
taken as they were: :func:`check_resumable` compares the checkpoint's stored config with this run's
(:data:`RESUME_KEYS` must stay; :data:`SCHEDULE_KEYS` may change when every update taken keeps its learning rate),
the process count, the steps per epoch, the Parameters and the accumulation window. The file format itself (write,
read, CRC32, durable) is :mod:`trainkit.rundir.checkpoint_file`.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import nn
from omegaconf import DictConfig, OmegaConf

from trainkit.errors import ConfigError
from trainkit.process.moved_modules import current_name
from trainkit.rundir.checkpoint_file import SavedCheckpoint, _scalar
from trainkit.rundir.kernel_path import check_same_kernels
from trainkit.rundir.parameter_fit import fit_problems, listing
from trainkit.rundir.trust import check_trusted, targets
from trainkit.step.running_totals import RUNNING_TOTALS

log = logging.getLogger("trainkit")

# The config keys an exact resume depends on: a different value changes the parameters' shapes, the samples
# trained and evaluated on, their order or the step sequence. Differences elsewhere (clipping, logging,
# evaluation...) are allowed and logged. Every data key is one, except those of DATA_KEYS_FREE.
RESUME_KEYS = ("model", "data", "loss", "optimizer", "wrapper._target_", "wrapper.accumulation_steps", "trainer.seed")
# The data keys a resume may change: they decide how fast the samples arrive (threads, prefetching) or whether
# missing files may be fetched, never which samples a data module gives or in what order. Any other data key
# (the split, its fraction and seed, the class subset, the task, the files, the image size...) may change the
# samples, so a resume refuses a change of it, naming the key.
DATA_KEYS_FREE = ("data.num_parallel_workers", "data.num_workers", "data.prefetch_size", "data.download")
# Keys that reach the past only through the learning rate of each update: a change is allowed when every update
# already taken keeps its rate (more epochs of a constant schedule, or of a step schedule whose milestones lie
# ahead), and refused otherwise (a cosine stretched over more epochs changes every rate).
SCHEDULE_KEYS = ("trainer.epochs", "lr_schedule", "optimizer.lr", "parallel.lr_scaling")
_RATE_TABLE = "learning_rate"  # the Parameter a MindSpore optimizer keeps a list of rates in


def check_resumable(checkpoint: SavedCheckpoint, cfg: DictConfig, network: nn.Cell, steps_per_epoch: int,
                    group_size: int, learning_rates: Optional[Callable[[DictConfig], Sequence[float]]] = None) -> None:
    """Raise ConfigError naming what differs between `checkpoint` and this run and would change its past; log the
    differences that do not.

    The rule: a resume continues the run the checkpoint belongs to, so the config may change whatever leaves the
    steps already taken as they were. Keys that decide the network, the data and its order, or what one update
    does (:data:`RESUME_KEYS`) must stay; keys that act through the learning-rate schedule (:data:`SCHEDULE_KEYS`)
    may change when ``learning_rates(config)`` (one rate per update) gives every update already taken
    (``global_step`` of the checkpoint) the same rate under both configs; anything else (clipping, logging,
    evaluation, checkpoints) changes only what comes next.
    """
    where = f"checkpoint {checkpoint.path}"
    if checkpoint.config is not None:
        now = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        differences = [(key, before, after) for key, before, after in _differences(checkpoint.config, now)
                       if key != "run_dir" and not key.startswith("trainer.resume")]
        decisive = [d for d in differences if _is_resume_key(d[0]) and not _is_schedule_key(d[0])]
        scheduled = [d for d in differences if _is_schedule_key(d[0])]
        if scheduled and not decisive:  # the checkpoint's schedule is built: it may name only trusted targets
            check_trusted(checkpoint.config, f"the config stored in {where}",
                          [target for _, target in targets(now) if isinstance(target, str)],
                          how="this run's config naming the same target")
            _check_past_rates(checkpoint, now, scheduled, learning_rates)
            _use_this_runs_rate_table(checkpoint, network)
        if decisive:
            shown = "; ".join(f"{key}: {_show(before)} in the checkpoint, {_show(after)} now"
                              for key, before, after in decisive[:6])
            samples = (" (a data key decides which samples are trained and evaluated on; only "
                       f"{', '.join(DATA_KEYS_FREE)} may change)" if any(d[0].startswith("data.") for d in decisive)
                       else "")
            raise ConfigError(f"{where} was written by a run configured differently, and an exact resume needs the "
                              f"same {', '.join(sorted({_resume_key(d[0]) for d in decisive}))}{samples}: {shown}. "
                              "Resume with the checkpoint's values (its run's .hydra/config.yaml) or start a new run")
        for key, before, after in differences:
            if not _is_schedule_key(key):
                log.info("resume: %s was %s in the checkpoint, now %s", key, _show(before), _show(after))
    if checkpoint.group_size != group_size:
        raise ConfigError(f"{where} was written by a data-parallel job of {checkpoint.group_size} processes and this "
                          f"one has {group_size}: the data shards and steps differ; resume with "
                          f"{checkpoint.group_size} processes")
    if checkpoint.position.steps_per_epoch != steps_per_epoch:
        raise ConfigError(f"{where} has {checkpoint.position.steps_per_epoch} steps per epoch and this run "
                          f"{steps_per_epoch}: the training data differs (data.root, its files, data.batch_size)")
    _check_parameters(checkpoint, network)
    _check_window(checkpoint, int(cfg.wrapper.get("accumulation_steps", 1)), where)
    check_same_kernels(checkpoint.kernel_path, network, cfg.trainer.get("resume_kernels", "same"), where)


def restore(checkpoint: SavedCheckpoint, network: nn.Cell) -> None:
    """Load every Parameter of `network` from `checkpoint` (checked first by :func:`check_resumable`)."""
    not_loaded, _ = ms.load_param_into_net(network, dict(checkpoint.parameters), strict_load=True)
    not_loaded = [name for name in not_loaded if name not in RUNNING_TOTALS]  # metrics; absent from older files
    if not_loaded:
        raise ConfigError(f"checkpoint {checkpoint.path}: {listing(not_loaded)} could not be loaded")


# ------------------------------------------------------------------- helpers
def _check_parameters(checkpoint: SavedCheckpoint, network: nn.Cell) -> None:
    own = {p.name: p for p in network.get_parameters()}
    # The wrapper's running totals (metrics_on_device) may be on either side alone: metrics, not the model's state.
    problems = fit_problems(own, checkpoint.parameters, "the checkpoint", "this run's network",
                            excused=RUNNING_TOTALS.__contains__, dtypes=True)
    if problems:
        raise ConfigError(f"checkpoint {checkpoint.path} does not fit this run's model and training state "
                          f"({'; '.join(problems)}): was it written by another model or with other wrapper "
                          "features (wrapper.ema_decay, wrapper.accumulation_steps, wrapper.loss_scale, "
                          "wrapper.skip_nonfinite)?")


def _check_window(checkpoint: SavedCheckpoint, accumulation_steps: int, where: str) -> None:
    """The place in its accumulation window a checkpoint holds (``micro_step``) follows from its micro-batches done;
    a file that says otherwise (written or edited by something else) would shift every later window, silently."""
    if accumulation_steps <= 1 or "micro_step" not in checkpoint.parameters:
        return
    held = int(_scalar(checkpoint.parameters["micro_step"]))
    expected = checkpoint.position.micro_steps % accumulation_steps
    if held != expected:
        raise ConfigError(f"{where} holds micro_step {held}, but {checkpoint.position.micro_steps} micro-batches "
                          f"done with wrapper.accumulation_steps={accumulation_steps} put a run at micro-batch "
                          f"{expected} of its window: this file was not written by such a run; resume from another")


def _differences(before: DictConfig, after: DictConfig, prefix: str = "") -> Iterable[Tuple[str, object, object]]:
    keys = list(dict.fromkeys([*before.keys(), *after.keys()]))
    for key in keys:
        name = f"{prefix}{key}"
        old = before.get(key) if key in before else _ABSENT
        new = after.get(key) if key in after else _ABSENT
        if isinstance(old, DictConfig) and isinstance(new, DictConfig):
            yield from _differences(old, new, f"{name}.")
        elif _plain(old) != _plain(new) and not _same_target(key, old, new):
            yield name, old, new


def _check_past_rates(checkpoint: SavedCheckpoint, now: DictConfig, scheduled: List[Tuple[str, object, object]],
                      learning_rates: Optional[Callable[[DictConfig], Sequence[float]]]) -> None:
    """Refuse schedule changes that give an update already taken another learning rate (see check_resumable)."""
    changed = "; ".join(f"{key}: {_show(before)} in the checkpoint, {_show(after)} now" for key, before, after in
                        scheduled[:6])
    keys = ", ".join(sorted({_schedule_key(key) for key, _, _ in scheduled}))
    done = int(_scalar(checkpoint.parameters["global_step"])) if "global_step" in checkpoint.parameters else None
    if learning_rates is None or done is None:
        raise ConfigError(f"checkpoint {checkpoint.path} was written by a run configured differently, and an exact "
                          f"resume needs the same {keys}: {changed}")
    before, after = list(learning_rates(checkpoint.config))[:done], list(learning_rates(now))[:done]
    for update, (old, new) in enumerate(zip(before, after)):
        if old != new:
            schedule = now.get("lr_schedule", {}).get("_target_", "the schedule")
            raise ConfigError(
                f"checkpoint {checkpoint.path} cannot be continued with {changed}: that changes the learning rate of "
                f"updates already taken ({done} so far; update {update + 1} used {old:.6g}, under this config "
                f"{new:.6g}, {schedule}), so the run would not be the one continued. Continue with the checkpoint's "
                f"{keys}, change only what lies ahead (a constant schedule, or step milestones after epoch "
                f"{int(checkpoint.position.epoch)}), or start a new run from the checkpoint's weights "
                "(python -m trainkit.export)")
    if len(after) < done:
        raise ConfigError(f"checkpoint {checkpoint.path} has taken {done} updates and this config has {len(after)}: "
                          f"{changed}")
    for key, old, new in scheduled:
        log.info("resume: %s was %s in the checkpoint, now %s (the %d updates taken keep their learning rates)",
                 key, _show(old), _show(new), done)


def _use_this_runs_rate_table(checkpoint: SavedCheckpoint, network: nn.Cell) -> None:
    """The optimizer's table of rates (``learning_rate``, one per update of the run) is the new config's: its past
    entries were just found equal to the checkpoint's, its length and future entries are what changed."""
    for parameter in network.get_parameters():
        if parameter.name == _RATE_TABLE and _RATE_TABLE in checkpoint.parameters:
            checkpoint.parameters[_RATE_TABLE] = ms.Parameter(ms.Tensor(parameter.asnumpy()), name=_RATE_TABLE)


def _is_resume_key(key: str) -> bool:
    if any(key == k or key.startswith(k + ".") for k in DATA_KEYS_FREE):
        return False
    return any(key == k or key.startswith(k + ".") for k in RESUME_KEYS)


def _is_schedule_key(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in SCHEDULE_KEYS)


def _schedule_key(key: str) -> str:
    return next(k for k in SCHEDULE_KEYS if key == k or key.startswith(k + "."))


def _resume_key(key: str) -> str:
    if key.startswith("data."):  # each data key on its own: which of them changed the samples
        return key
    return next(k for k in RESUME_KEYS if key == k or key.startswith(k + "."))


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _same_target(key: str, old: object, new: object) -> bool:
    """A ``_target_`` a run stored under a module's path before 0.2 (``trainkit.losses.CrossEntropy``) names what its
    current path names: the same target, not a change."""
    return (key == "_target_" and isinstance(old, str) and isinstance(new, str)
            and current_name(old) == current_name(new))


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _show(value) -> str:
    return "absent" if value is _ABSENT else repr(_plain(value))
