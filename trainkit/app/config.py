"""The app's configuration: structured schemas registered in Hydra, recipes, and value checks.

Hydra validates what it can before anything runs: a typo in a key or a wrong type fails on the
schemas below, an unknown group choice (``amp=O5``) fails on the config groups in
``trainkit/configs``. What a type cannot say (``accumulation_steps=0``, ``ema_decay=1.5``) is
checked by :func:`check_config`, which names the key and what is valid.

Two kinds of groups:

* trainkit's own (``trainer``, ``logger``, ``parallel``, ``amp`` and the top level) are closed: their keys are
  the dataclass fields below. Hydra refuses ``trainer.epoch=3``; ``+trainer.epoch=3`` and ``+foo=1`` get past
  Hydra (``+`` adds keys to any node), so :func:`check_config` refuses them too, with a did-you-mean.
* ``_target_`` groups (``model``, ``data``, ``loss``, ``metrics``, ``optimizer``, ``lr_schedule``, ``wrapper``,
  ``callbacks``) are open: they take whatever arguments their target accepts, with or without ``+``, and
  ``trainkit.app.targets`` checks those keys against the target's signature before anything is built.
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from importlib import resources
from typing import Any, Iterable, List, Optional

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from trainkit.checks import choice, did_you_mean
from trainkit.errors import ConfigError

CONFIG_MODULE = "trainkit.configs"
RECIPES_MODULE = "trainkit.recipes"
OPEN_GROUPS = ("model", "data", "loss", "metrics", "optimizer", "lr_schedule", "wrapper", "callbacks")
# Metric names whose smaller values are better, for trainer.best_mode=auto (and any name containing "loss" or
# "error").
SMALLER_IS_BETTER = ("mae", "mse", "rmse", "mape", "perplexity", "hausdorff_distance", "mean_surface_distance",
                     "root_mean_square_distance")


class ExecutionMode(Enum):
    graph = "graph"
    pynative = "pynative"


class AmpLevel(Enum):
    O0 = "O0"
    O1 = "O1"
    O2 = "O2"
    O3 = "O3"


class ParallelMode(Enum):
    stand_alone = "stand_alone"
    data_parallel = "data_parallel"
    semi_auto_parallel = "semi_auto_parallel"
    auto_parallel = "auto_parallel"
    hybrid_parallel = "hybrid_parallel"


class LrScaling(Enum):
    none = "none"      # optimizer.lr as given, whatever the number of workers
    linear = "linear"  # optimizer.lr x the number of data-parallel workers (Goyal et al., 2017)


class LossScale(Enum):
    none = "none"
    static = "static"
    dynamic = "dynamic"


class ResumeData(Enum):
    exact = "exact"  # replay the data pipeline to the checkpoint: the same samples and the same augmentations
    fast = "fast"  # jump there: the same samples in the same order, random augmentations drawn anew


class ResumeKernels(Enum):
    same = "same"  # refuse a resume on the other kernel path (fused C++ / MindSpore's): it would not be bitwise
    any = "any"  # allow it, with a warning


class BestMode(Enum):
    auto = "auto"  # min for a loss or an error (loss, mae, mse, ...), max otherwise
    min = "min"
    max = "max"


class ProgressStyle(Enum):
    auto = "auto"  # an updating line on a terminal, log lines otherwise
    bar = "bar"
    log = "log"
    off = "off"


@dataclass
class AmpConfig:
    """``mindspore.amp.auto_mixed_precision(network, level)``; the loss stays float32."""

    level: AmpLevel = AmpLevel.O0


@dataclass
class ParallelConfig:
    """``mindspore.set_auto_parallel_context(parallel_mode=mode, gradients_mean=...)`` and the ``msrun`` launch.

    ``workers`` processes per machine on ``nodes`` machines; ``node_rank``, ``master_addr`` and ``master_port``
    are msrun's ``--node_rank``, ``--master_addr`` and ``--master_port`` (null port: a free one, one machine only).
    ``lr_scaling`` turns ``optimizer.lr`` into the rate of the whole job before the schedule. ``join_timeout`` and
    ``max_restarts`` are the launcher's (trainkit/distributed/launch.py).
    """

    mode: ParallelMode = ParallelMode.stand_alone
    gradients_mean: bool = True
    workers: int = 1
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    lr_scaling: LrScaling = LrScaling.none
    join_timeout: float = 300.0  # seconds a machine waits for the job's others (and its workers for msrun's cluster)
    max_restarts: int = 0  # a lost worker starts the job again with trainer.resume=auto, up to this many times


@dataclass
class WrapperConfig:
    """The TrainingWrapper's arguments; ``loss_scale*``/``scale_*`` build its loss scaler.

    Open: a TrainingWrapper subclass's own arguments may be added (checked against its signature).
    """

    _target_: str = "trainkit.TrainingWrapper"
    loss_scale: LossScale = LossScale.none
    loss_scale_value: float = 65536.0
    scale_factor: int = 2
    scale_window: int = 1000
    max_grad_norm: Optional[float] = None
    accumulation_steps: int = 1
    ema_decay: Optional[float] = None
    ema_warmup: bool = False
    ema_every: int = 1
    compute_grad_norm: bool = True
    skip_nonfinite: bool = True
    metrics_on_device: bool = True


@dataclass
class ProfileConfig:
    """``trainer.profile``: ``mindspore.profiler`` over a window of steps only (trainkit/app/profiling.py)."""

    steps: int = 0  # steps to profile; 0: off
    start_step: int = 1  # the first profiled step (1: the first, which includes compilation)
    ranks: List[int] = field(default_factory=lambda: [0])  # the ranks that profile in data parallel
    top_operators: int = 10  # operators listed in the summary at the end


@dataclass
class EarlyStoppingConfig:
    """``trainer.early_stopping``: stop after `patience` evaluations that did not improve `metric` by > `min_delta`.

    ``metric`` null: off; else one of accuracy, loss, ema_accuracy, ema_loss. ``mode``: auto (min for a loss, max
    for an accuracy), min or max.
    """

    metric: Optional[str] = None
    mode: str = "auto"
    patience: int = 3
    min_delta: float = 0.0


@dataclass
class TrainerConfig:
    """How the loop runs: ``mindspore.train.Model.train`` and the callbacks around it."""

    epochs: int = 1
    mode: ExecutionMode = ExecutionMode.graph
    device_target: str = "auto"
    dataset_sink_mode: bool = False
    sink_size: int = -1
    seed: int = 0
    eval_interval: int = 1
    save_checkpoints: bool = True
    keep_checkpoints: int = 3
    evaluate: bool = True
    test: Optional[bool] = None
    best_metric: Optional[str] = None
    best_mode: BestMode = BestMode.auto
    checkpoint_every_n_steps: int = 0
    resume: Optional[str] = None
    resume_data: ResumeData = ResumeData.exact
    resume_kernels: ResumeKernels = ResumeKernels.same
    max_nonfinite_steps: Optional[int] = 10
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)


@dataclass
class LoggerConfig:
    """What the run records: TensorBoard events, a JSON-lines metrics file, progress on the console."""

    tensorboard: bool = True
    metrics_file: Optional[str] = "metrics.jsonl"
    progress: ProgressStyle = ProgressStyle.auto
    log_every_n_steps: int = 10
    mindspore_warnings: bool = False  # MindSpore's own warnings (GLOG_v=2); read on the command line only


@dataclass
class SweepConfig:
    """``sweep``: how a ``-m`` sweep runs its jobs (trainkit's launcher, ``hydra/launcher=trainkit``).

    ``repeats``: run every configuration with this many seeds, ``trainer.seed`` + 0 .. repeats - 1; the summary
    groups them and says whether the winner is told apart from the others by more than the seeds' spread. At most
    ``MAX_REPEATS``, and repeats x the sweeper's configurations at most ``MAX_SWEEP_JOBS``, checked before the sweep
    starts (``trainkit.app.sweep.launcher.size_problem``).
    """

    repeats: int = 1


@dataclass
class TrainkitConfig:
    """The whole run. ``model``, ``data``, ``loss``, ``optimizer`` and ``lr_schedule`` are ``_target_`` nodes,
    ``metrics`` maps names to ``_target_`` nodes, ``callbacks`` is a list of them."""

    model: Any = MISSING
    data: Any = MISSING
    loss: Any = MISSING
    metrics: Any = MISSING
    optimizer: Any = MISSING
    lr_schedule: Any = MISSING
    callbacks: Any = field(default_factory=list)
    amp: AmpConfig = field(default_factory=AmpConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    wrapper: WrapperConfig = field(default_factory=WrapperConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    run_dir: str = "${hydra:runtime.output_dir}"


def recipe_names() -> list:
    """The recipes shipped in ``trainkit/recipes``."""
    return sorted(p.name[:-5] for p in resources.files(RECIPES_MODULE).iterdir() if p.name.endswith(".yaml"))


def schema_node() -> DictConfig:
    """:class:`TrainkitConfig` with the ``_target_`` groups open (not in struct mode), so that Hydra lets their
    nodes take any key, with or without ``+``; the closed groups stay in Hydra's struct mode."""
    node = OmegaConf.structured(TrainkitConfig)
    for group in OPEN_GROUPS:
        if group not in ("wrapper", "callbacks"):
            node[group] = {}
        OmegaConf.set_struct(node[group], False)
    # The closed groups' keys, at every depth, are checked by check_closed_keys, which names the key and offers the
    # closest one (Hydra's struct error is six lines without a suggestion, and exits with status 1).
    for group in CLOSED_GROUPS:
        OmegaConf.set_struct(node[group], False)
        for key in node[group]:
            if isinstance(node[group][key], DictConfig):  # trainer.profile, trainer.early_stopping: checked too
                OmegaConf.set_struct(node[group][key], False)
    return node


def register_configs() -> None:
    """Store the schemas and the recipes in Hydra's ConfigStore (idempotent).

    Recipes live in ``trainkit/recipes/`` and are offered as the config group ``recipe``,
    merged at the global level (each is an experiment overlay on the defaults).
    """
    store = ConfigStore.instance()
    store.store(name="trainkit_schema", node=schema_node())
    folder = resources.files(RECIPES_MODULE)
    for name in recipe_names():
        recipe = OmegaConf.create((folder / f"{name}.yaml").read_text(encoding="utf-8"))
        store.store(group="recipe", name=name, node=recipe, package="_global_")


def compose_config(overrides: Iterable[str] = ()) -> DictConfig:
    """The config ``python -m trainkit OVERRIDES...`` would run, for scripts and tests.

    Pass ``run_dir=PATH`` among the overrides: outside a Hydra run there is no output directory.
    """
    register_configs()
    with initialize_config_module(CONFIG_MODULE, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


# --------------------------------------------------------------------------- checks
def check_override_types(arguments: Iterable[str]) -> None:
    """Raise ConfigError for a command-line value of trainkit's own groups that its type refuses (``trainer.epochs=
    abc``), each value of a choice or range sweep too, before Hydra's composition turns it into its six lines and
    status 1. Interpolations, deletions, Hydra's own keys and the ``_target_`` groups are left to later checks."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf.errors import OmegaConfBaseException

    given = [a for a in arguments if "=" in a and not a.startswith("-") and not a.lstrip("~+").startswith("hydra")]
    try:
        overrides = OverridesParser.create().parse_overrides(given)
    except Exception:  # noqa: BLE001 -- Hydra's own parser reports a malformed override as it always has
        return
    schema = None
    for override in overrides:
        key = override.key_or_group
        group = key.split(".", 1)[0]
        if override.is_delete() or group not in _TYPED_GROUPS or "." not in key:
            continue
        try:
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except Exception:  # noqa: BLE001 -- an interval sweep (Optuna's): its bounds are Optuna's to check
            continue
        schema = schema if schema is not None else OmegaConf.structured(TrainkitConfig)
        for value in values:
            if isinstance(value, str) and "${" in value:
                continue
            try:
                OmegaConf.update(schema.copy(), key, value, merge=True)
            except OmegaConfBaseException as error:
                if OmegaConf.select(schema, key, default=_ABSENT) is _ABSENT:
                    break  # an unknown key: check_closed_keys names it, with a suggestion
                wanted = _type_name(schema, key)
                raise ConfigError(f"{key}={override.input_line.split('=', 1)[1] if override.input_line else value}: "
                                  f"{key} takes {wanted}, not {value!r} ({type(error).__name__})") from None


_ABSENT = object()
_TYPED_GROUPS = {name for name, hint in typing.get_type_hints(TrainkitConfig).items() if is_dataclass(hint)}


def _type_name(schema: DictConfig, key: str) -> str:
    """What the schema's `key` holds, in words: an integer, a number, true or false, one of its enum's names."""
    parent_key, _, leaf = key.rpartition(".")
    node = OmegaConf.select(schema, parent_key) if parent_key else schema
    kind = OmegaConf.get_type(node, leaf) if isinstance(node, DictConfig) else None
    hints = typing.get_type_hints(OmegaConf.get_type(node)) if isinstance(node, DictConfig) else {}
    hint = hints.get(leaf, kind)
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        return f"null or {_type_name_of(hint)}"
    return _type_name_of(hint)


def _type_name_of(hint: Any) -> str:
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "one of " + ", ".join(member.name for member in hint)
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


MAX_MICRO_BATCHES = 10 ** 8  # trainer.epochs x steps per epoch: the learning-rate table is 400 MB there
MAX_IMAGE_SIZE = 4096  # a side; a 4096 x 4096 float32 RGB image is 192 MiB
MAX_REPEATS = 1000  # sweep.repeats: seeds per configuration (a typo such as 1000000000 for 10 is refused at once)
MAX_SWEEP_JOBS = 10_000  # sweep.repeats x the configurations a sweeper asks for: the jobs of one -m sweep


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first key that is unknown or whose value is impossible, and what is valid.

    Unknown keys of trainkit's own groups come first, then values, then the ``_target_`` groups' keys against
    their targets' signatures (``trainkit.app.targets``, which imports the targets but builds nothing).
    """
    check_closed_keys(cfg)
    wrapper, trainer, logger = cfg.wrapper, cfg.trainer, cfg.logger
    _check("wrapper.accumulation_steps", wrapper.accumulation_steps, "an integer >= 1", lambda v: v >= 1)
    if wrapper.max_grad_norm is not None:
        _check("wrapper.max_grad_norm", wrapper.max_grad_norm, "null (no clipping) or a finite number > 0",
               lambda v: math.isfinite(v) and v > 0)
    if wrapper.ema_decay is not None:
        _check("wrapper.ema_decay", wrapper.ema_decay, "null (no EMA) or a number in [0, 1)",
               lambda v: 0 <= v < 1)
    _check("wrapper.ema_every", wrapper.ema_every, "an integer >= 1", lambda v: v >= 1)
    if choice(wrapper.loss_scale) != "none":
        _check("wrapper.loss_scale_value", wrapper.loss_scale_value,
               "a number in [1, 2**32] (1/scale must stay a normal float32)", lambda v: 1 <= v <= 2.0 ** 32)
    if choice(wrapper.loss_scale) == "dynamic":
        _check("wrapper.scale_factor", wrapper.scale_factor, "an integer >= 2", lambda v: v >= 2)
        _check("wrapper.scale_window", wrapper.scale_window, "an integer >= 1", lambda v: v >= 1)
    _check("trainer.epochs", trainer.epochs, f"an integer in [1, {MAX_MICRO_BATCHES:,}] (the run's learning-rate "
           "table holds one number per update)", lambda v: 1 <= v <= MAX_MICRO_BATCHES)
    _check("trainer.seed", trainer.seed, "an integer in [0, 2**32)", lambda v: 0 <= v < 2 ** 32)
    _check_repeats(cfg)
    _check("trainer.sink_size", trainer.sink_size, "-1 (a whole epoch per sink) or an integer >= 1",
           lambda v: v == -1 or v >= 1)
    _check("trainer.eval_interval", trainer.eval_interval, "an integer >= 0 (0: evaluate after the last epoch only)",
           lambda v: v >= 0)
    if trainer.max_nonfinite_steps is not None:
        _check("trainer.max_nonfinite_steps", trainer.max_nonfinite_steps, "null or 0 (never stop) or an integer >= 1",
               lambda v: v >= 0)
    _check("trainer.keep_checkpoints", trainer.keep_checkpoints, "an integer >= 1", lambda v: v >= 1)
    _check("trainer.checkpoint_every_n_steps", trainer.checkpoint_every_n_steps,
           "an integer >= 0 (0: a checkpoint at each epoch end only)", lambda v: v >= 0)
    if trainer.resume is not None and not str(trainer.resume).strip():
        raise ConfigError("trainer.resume='' is not valid: use null (a new run), auto (the newest valid checkpoint "
                          "of the run directory) or the path of a checkpoint or run directory")
    if trainer.evaluate:
        _check_best_metric(cfg)
    _check_early_stopping(cfg)
    valid_targets = ("CPU", "GPU", "Ascend", "auto")
    if trainer.device_target not in valid_targets:
        raise ConfigError(f"trainer.device_target={trainer.device_target!r} is not valid: use one of "
                          f"{', '.join(valid_targets)}")
    _check("logger.log_every_n_steps", logger.log_every_n_steps, "an integer >= 1", lambda v: v >= 1)
    metrics_file = logger.metrics_file
    if metrics_file is not None and (not metrics_file or metrics_file in (".", "..")
                                     or any(sep in metrics_file for sep in ("/", "\\"))):
        raise ConfigError(f"logger.metrics_file={metrics_file!r} is not valid: it must be null or a file name "
                          "(no folders), written inside the run directory, e.g. metrics.jsonl")
    for key in ("data.batch_size", "data.image_size", "model.num_classes"):
        group, name = key.split(".")
        value = cfg[group].get(name)
        if value is not None:
            _check(key, value, "an integer >= 1", lambda v: isinstance(v, int) and v >= 1)
    image_size = cfg.data.get("image_size")
    if isinstance(image_size, int) and image_size > MAX_IMAGE_SIZE:
        raise ConfigError(f"data.image_size={image_size} is not valid: it must be at most {MAX_IMAGE_SIZE} (one "
                          f"{image_size}x{image_size} float32 RGB image alone would take "
                          f"{image_size * image_size * 12 / 2 ** 30:,.1f} GiB)")
    lr = cfg.optimizer.get("lr")
    if lr is None:
        raise ConfigError("optimizer.lr is missing: the base learning rate of the schedule, e.g. optimizer.lr=0.001")
    _check("optimizer.lr", lr, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)
    if cfg.optimizer.get("weight_decay") is not None:
        _check("optimizer.weight_decay", cfg.optimizer.weight_decay, "a number >= 0", lambda v: v >= 0)
    from trainkit.app.targets import check_target_arguments  # imports users' modules: only once the rest passed

    check_target_arguments(cfg)


CLOSED_GROUPS = {"amp": AmpConfig, "parallel": ParallelConfig, "trainer": TrainerConfig, "logger": LoggerConfig,
                 "sweep": SweepConfig}


def check_closed_keys(cfg: DictConfig) -> None:
    """Refuse a key that trainkit's own groups or the top level do not have.

    Hydra refuses ``trainer.epoch=3`` itself, but ``+trainer.epoch=3`` or ``+foo=1`` add the key to any node;
    without this check the run would go on with the key ignored.
    """
    top_level = [f.name for f in fields(TrainkitConfig)]
    for key in cfg:
        if key not in top_level:
            raise ConfigError(f"unknown key {key}: {did_you_mean(key, top_level)}the top level takes "
                              f"{', '.join(top_level)}")
    for group, schema in CLOSED_GROUPS.items():
        _check_schema_keys(cfg[group], schema, group)


def _check_schema_keys(node: DictConfig, schema: type, path: str) -> None:
    """Every key of `node` is a field of the dataclass `schema`, at every depth of its dataclass-typed fields."""
    valid = [f.name for f in fields(schema)]
    types = typing.get_type_hints(schema)  # the annotations are strings here (postponed evaluation)
    for key in node:
        if key not in valid:
            raise ConfigError(f"unknown key {path}.{key}: {did_you_mean(key, valid, path + '.')}"
                              f"{path} takes {', '.join(valid)}")
        nested = types.get(key)
        if is_dataclass(nested) and isinstance(node[key], DictConfig):
            _check_schema_keys(node[key], nested, f"{path}.{key}")


def _check_repeats(cfg: DictConfig) -> None:
    """``sweep.repeats``: an integer >= 1, and above 1 only in a ``-m`` sweep run by trainkit's launcher."""
    from trainkit.app.sweep.records import LAUNCHER, in_sweep
    from trainkit.distributed.parallel import launched_by_msrun

    repeats = cfg.sweep.repeats
    _check("sweep.repeats", repeats, f"an integer in [1, {MAX_REPEATS:,}] (the seeds each configuration of a -m sweep "
           "runs with)", lambda v: 1 <= v <= MAX_REPEATS)
    if repeats == 1 or launched_by_msrun():  # a worker of a data-parallel job: its launcher was checked
        return
    if not in_sweep():
        raise ConfigError(f"sweep.repeats={repeats} runs each configuration of a -m sweep with {repeats} seeds: add -m "
                          "to the command, or leave sweep.repeats at 1 for one run")
    from hydra.core.hydra_config import HydraConfig

    launcher = OmegaConf.select(HydraConfig.get(), "launcher._target_", default=None)
    if launcher != LAUNCHER:
        raise ConfigError(f"sweep.repeats={repeats} is done by trainkit's launcher (hydra/launcher=trainkit, the "
                          f"default), not {launcher}: choose hydra/launcher=trainkit, or sweep trainer.seed instead "
                          "(trainer.seed=0,1,2: its runs are grouped the same way)")


def reported_metrics(cfg: DictConfig) -> list:
    """The names an evaluation reports: each of ``metrics`` and ``loss``, with ``ema_`` twins under EMA."""
    metrics = cfg.get("metrics")
    names = [str(name) for name in (metrics or {})] + ["loss"]
    if cfg.wrapper.get("ema_decay") is not None:
        names += [f"ema_{name}" for name in names]
    return names


def best_metric(cfg: DictConfig) -> str:
    """``trainer.best_metric``, or when null the first name in ``metrics`` (``loss`` when there is none)."""
    if cfg.trainer.best_metric is not None:
        return cfg.trainer.best_metric
    return reported_metrics(cfg)[0]


def best_mode(metric: str, mode: Any) -> str:
    """``min`` or ``max``: `mode` unless it is ``auto``, else from the metric's name (min for a loss or error)."""
    mode = choice(mode)
    if mode != "auto":
        return mode
    name = metric[4:] if metric.startswith("ema_") else metric
    smaller = "loss" in name or "error" in name or name in SMALLER_IS_BETTER
    return "min" if smaller else "max"


def _check_best_metric(cfg: DictConfig) -> None:
    best, names = best_metric(cfg), reported_metrics(cfg)
    if best in names:
        return
    if best.startswith("ema_") and cfg.wrapper.get("ema_decay") is None and best[4:] in names:
        raise ConfigError(f"trainer.best_metric={best} needs EMA weights: set wrapper.ema_decay "
                          f"(e.g. 0.999) or pick {'/'.join(names)}")
    raise ConfigError(f"trainer.best_metric={best!r} is not valid: use one of {', '.join(names)} (the loss and the "
                      f"names in metrics); {did_you_mean(best, names)}or trainer.evaluate=false to train without "
                      "evaluating")


def _check_early_stopping(cfg: DictConfig) -> None:
    early = cfg.trainer.early_stopping
    if early.metric is None:
        return
    if not cfg.trainer.evaluate:
        raise ConfigError(f"trainer.early_stopping.metric={early.metric} needs evaluations: set trainer.evaluate=true "
                          "or trainer.early_stopping.metric=null")
    names = reported_metrics(cfg)
    if early.metric not in names:
        if early.metric.startswith("ema_") and cfg.wrapper.get("ema_decay") is None and early.metric[4:] in names:
            raise ConfigError(f"trainer.early_stopping.metric={early.metric} needs EMA weights: set "
                              f"wrapper.ema_decay (e.g. 0.999) or pick {'/'.join(names)}")
        raise ConfigError(f"trainer.early_stopping.metric={early.metric!r} is not valid: use null (off) or one of "
                          f"{', '.join(names)} (the loss and the names in metrics); "
                          f"{did_you_mean(early.metric, names)}")
    if early.mode not in ("auto", "min", "max"):
        raise ConfigError(f"trainer.early_stopping.mode={early.mode!r} is not valid: use auto (min for a loss or an "
                          "error, max otherwise), min or max")
    _check("trainer.early_stopping.patience", early.patience, "an integer >= 1 (evaluations without improvement)",
           lambda v: isinstance(v, int) and v >= 1)
    _check("trainer.early_stopping.min_delta", early.min_delta, "a finite number >= 0",
           lambda v: math.isfinite(v) and v >= 0)


def _check(key: str, value: Any, valid: str, in_range) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not in_range(value):
        raise ConfigError(f"{key}={value} is not valid: it must be {valid}")
