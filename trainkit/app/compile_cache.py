"""MindSpore's compile cache for `python -m trainkit`: a second run of the same config skips most of compiling.

Compiling the train and eval graphs is about a third of the quick start's first run (docs/performance.md);
MindSpore 2.10 can save the compiled graphs (``set_context(enable_compile_cache=True, compile_cache_path=...)``)
and load them in the next process. It keys what it saves by the order of compiles in the process and checks
little else: a cache filled by a run without an EMA, loaded by a run with one, gives that run an EMA that never
moves. So trainkit gives every config its own folder, keyed by everything that
shapes a graph and that it can see before the run builds anything --

- the composed config with every interpolation resolved (``${oc.env:...}`` and references alike: a value that
  reaches the config through one is keyed by what it is in this run), without ``run_dir`` and without the
  :data:`GRAPH_DATA_KEYS` (values the graphs read only as data, such as the learning rate: a sweep over them runs
  one set of graphs); MindSpore's and Python's versions;
- the source of trainkit and of every module a ``_target_`` of the config names outside MindSpore;
- the size and modification time of every file the config names;

and, inside that folder, a subfolder per set of shapes the data gave the built run (:func:`settle`: the network's
parameters, the steps per epoch, the evaluation batch), since a file can change and keep its size and time and a
folder of data is not keyed at all;

and uses the cache only for the first run of a process whose graphs compile first, never in a data-parallel
worker (its ranks would write one folder at once). A sweep's later jobs in the same process share the cells the
last job compiled instead, where their key is the same (:mod:`trainkit.app.graph_reuse`).
``TRAINKIT_COMPILE_CACHE=0`` turns both off; ``TRAINKIT_CACHE_DIR`` moves it (default
``$XDG_CACHE_HOME/trainkit``, else ``~/.cache/trainkit``). A saved graph is code, so a cache folder another user
can write is not used (:func:`trainkit.kernels.build.unsafe_folder`). A model whose module imports
other code of the user's that changes between runs is not seen by the key: turn the cache off while editing it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple

import mindspore as ms
from omegaconf import DictConfig, OmegaConf

from trainkit import kernels
from trainkit.distributed.parallel import launched_by_msrun
from trainkit.kernels.build import unsafe_folder

log = logging.getLogger("trainkit")

_PACKAGE = Path(__file__).resolve().parents[1]
_used_in_this_process = False
_active: Optional[Path] = None  # the folder enable() turned on, until disable()
UNSAVABLE = "unsavable.txt"  # in a config's folder: MindSpore could not save its graphs


def cache_root() -> Optional[Path]:
    """Where trainkit caches (None when ``TRAINKIT_COMPILE_CACHE`` turns the compile cache off)."""
    if os.environ.get("TRAINKIT_COMPILE_CACHE", "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    if os.environ.get("TRAINKIT_CACHE_DIR"):
        return Path(os.environ["TRAINKIT_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trainkit"


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def _targets(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            yield target
        for value in node.values():
            yield from _targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _targets(value)


def _module_file(target: str) -> Optional[Path]:
    """The source file of the module `target` (``package.module.Name``) lives in, or None inside MindSpore."""
    parts = target.split(".")
    for end in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:end])
        if name.split(".")[0] == "mindspore":
            return None
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            return Path(spec.origin)
    return None


# Keys whose value never reaches a graph, or reaches it only as data (a Parameter's value), so that runs that
# differ only in them run the same graphs. An explicit list: every other key is keyed, and a group whose
# ``_target_`` is not one of trainkit's or MindSpore's known ones (a user's) is keyed whole. Each entry was checked
# bitwise: a run whose graphs come from a run with another value trains as a run that compiled its own.
# trainkit's own schedules, under their path and the one runs stored before 0.2 (it still resolves, with a warning)
_OWN_SCHEDULES = ("trainkit.parts.lr_schedule.", "trainkit.lr_schedule.")
GRAPH_DATA_KEYS = {
    # MindSpore's optimizers take the per-update table as the ``learning_rate`` Parameter and gather from it with
    # ``global_step``: the rates are data; the table's length (epochs, batches per epoch) is a shape, keyed.
    "optimizer.lr": ("optimizer", "mindspore.nn."),
    "lr_schedule.warmup_epochs": ("lr_schedule", _OWN_SCHEDULES),
    "lr_schedule.min_lr": ("lr_schedule", _OWN_SCHEDULES),
    "lr_schedule.milestones": ("lr_schedule", _OWN_SCHEDULES),
    "lr_schedule.gamma": ("lr_schedule", _OWN_SCHEDULES),
    # What the callbacks around Model.train do: evaluation (of the same eval graph), checkpoints, logging.
    "trainer.eval_interval": None,
    "trainer.save_checkpoints": None,
    "trainer.keep_checkpoints": None,
    "trainer.checkpoint_every_n_steps": None,
    "trainer.best_metric": None,
    "trainer.best_mode": None,
    "trainer.early_stopping": None,
    "trainer.max_nonfinite_steps": None,
    "logger": None,
}


def _pop(container: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    node = container
    for name in parents:
        node = node.get(name) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def graph_config(cfg: DictConfig, data_keys: Tuple[str, ...] = ()) -> dict:
    """The resolved config less `run_dir`, the :data:`GRAPH_DATA_KEYS` that apply to it and `data_keys` (keys the
    caller checks itself): what shapes a graph."""
    container = OmegaConf.to_container(cfg, resolve=True)  # what the run will see, not how it was spelled
    container.pop("run_dir", None)
    # Decided on the config as given, before anything is popped: optimizer.lr is data only under trainkit's own
    # schedules (a user's schedule function could turn the rate into a shape or a constant).
    targets = {group: str((container.get(group) or {}).get("_target_", "")) for group in ("optimizer", "lr_schedule")}
    data_only = [key for key, where in GRAPH_DATA_KEYS.items()
                 if where is None or targets[where[0]].startswith(where[1])]
    if not targets["lr_schedule"].startswith(_OWN_SCHEDULES):
        data_only = [key for key in data_only if key != "optimizer.lr"]
    for key in [*data_only, *data_keys]:
        _pop(container, key)
    return container


def cache_key(cfg: DictConfig, data_keys: Tuple[str, ...] = ()) -> str:
    """A hash of what decides the graphs a run compiles (see the module's docstring), less `data_keys`."""
    container = graph_config(cfg, data_keys)
    digest = hashlib.sha256()
    digest.update(OmegaConf.to_yaml(OmegaConf.create(container)).encode())
    digest.update(f"{ms.__version__} {sys.version} {platform.machine()}".encode())
    # The graphs name trainkit's kernel library by its path, or run MindSpore's kernels where it does not build.
    digest.update(kernels.describe().encode())
    sources = sorted(_PACKAGE.rglob("*.py")) + sorted(_PACKAGE.rglob("*.cc"))
    sources += sorted({path for path in map(_module_file, _targets(container)) if path is not None
                       and _PACKAGE not in path.parents})
    for path in sources:
        digest.update(str(path).encode())
        digest.update(path.read_bytes())
    for text in sorted(set(_strings(container))):
        if len(text) < 4096 and os.sep in text:
            path = Path(text).expanduser()
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path.resolve()} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def _graphs_compiled_already() -> bool:
    from mindspore.graph import api

    return any(bool(phases) for phases in api.cells_compile_cache.values())


def _entry_script_readable() -> bool:
    """MindSpore's cache parses the process's entry script (``sys.argv[0]``) for its dependencies and crashes the
    first compile when that is no file (``python -c``, a notebook kernel, a pytest-xdist worker): no cache there."""
    from mindspore.graph import api

    return api.entry_script_path is not None and os.path.isfile(api.entry_script_path)


def enable(cfg: DictConfig) -> Optional[Path]:
    """Turn MindSpore's compile cache on in this config's folder; None where it stays off (see the module)."""
    global _used_in_this_process
    root = cache_root()
    if root is None or _used_in_this_process or _graphs_compiled_already() or not _entry_script_readable():
        return None
    if launched_by_msrun():  # every rank would write the same folder at once (a rank crashed at exit so)
        return None
    _used_in_this_process = True
    try:
        folder = root / "compile" / cache_key(cfg)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for level in (root / "compile", folder):
            level.mkdir(mode=0o700, exist_ok=True)
    except Exception as error:  # noqa: BLE001 -- a cache is never worth a failed run: the run itself reports bad input
        log.debug("compile cache off: %s", error)
        return None
    unsafe = unsafe_folder(folder)
    if unsafe:
        log.warning("compile cache: off (%s: a saved graph is code, and trainkit loads none that another user "
                    "could have written; this config compiles on every run)", unsafe)
        return None
    if (folder / UNSAVABLE).exists():
        log.info("compile cache: off (MindSpore cannot save this config's graphs, as an earlier run found: this "
                 "config compiles on every run)")
        return None
    # Said at the first compile, not now: a run refused before it (bad input, a directory in use) writes nothing.
    _compile_without_cache_where_mindspore_cannot_save(folder)
    ms.set_context(enable_compile_cache=True, compile_cache_path=str(folder))
    global _active
    _active = folder
    return folder


def settle(network: Any, steps_per_epoch: int, eval_set: Any) -> None:
    """Key this run's folder further by what the data made of its config, before the first compile: a file the
    config names can change and keep its size and time, and a folder (an image folder's classes) is not keyed at
    all, while the network's shapes, the learning-rate table's length and the evaluation batch follow the data.
    A graph compiled for other shapes is never loaded: each such variant gets a subfolder of its own."""
    global _active
    if _active is None or _active.parent.parent != cache_root():  # off, or settled already
        return
    shapes = [(p.name, tuple(p.shape), str(p.dtype)) for p in network.get_parameters()]
    described = repr((shapes, steps_per_epoch, eval_set.get_dataset_size(), eval_set.output_shapes(),
                      [str(kind) for kind in eval_set.output_types()]))
    folder = _active / hashlib.sha256(described.encode()).hexdigest()[:16]
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        log.debug("compile cache off: %s", error)
        disable()
        return
    ms.set_context(compile_cache_path=str(folder))
    _active = folder


def active_folder() -> Optional[Path]:
    """This run's cache folder (keyed by its config and sources), or None where the cache is off for it."""
    return _active


def _compile_without_cache_where_mindspore_cannot_save(folder: Path) -> None:
    """MindSpore 2.10 fails the compile of a graph its cache cannot save (``Cannot export a PyExecute CNode in
    MindIR``: graphs with Python fallbacks, e.g. the wrapper with accumulation and dynamic loss scaling) instead
    of compiling it uncached; such a graph is compiled again with the cache off, for the rest of the run, and
    the config's folder is marked so that its next runs do not try again."""
    from mindspore.graph import api

    original = api._CellGraphExecutor.compile
    if getattr(original, "_trainkit_fallback", False):
        original = original.__wrapped__

    untold = [True]

    def compile(self, obj, *args, **kwargs):
        if untold and ms.get_context("enable_compile_cache") and _active is not None:
            untold.pop()
            reused = any(_active.rglob("*.mindir"))
            log.info("compile cache: %s (%s)", _active, "graphs saved by an earlier run of this config" if reused
                     else "a new config: compiling and saving")
        try:
            return original(self, obj, *args, **kwargs)
        except RuntimeError as error:
            if "in MindIR" not in str(error) or not ms.get_context("enable_compile_cache"):
                raise
            log.info("compile cache: off for the rest of this run: MindSpore cannot save %s's graph (%s), so this "
                     "config compiles on every run", type(obj).__name__, str(error).strip().splitlines()[0])
            disable()
            (folder / UNSAVABLE).write_text(f"{type(obj).__name__}: {error}\n")
            return original(self, obj, *args, **kwargs)

    compile._trainkit_fallback = True
    compile.__wrapped__ = original
    api._CellGraphExecutor.compile = compile


def disable() -> None:
    """Turn the compile cache off again (after the run it was turned on for)."""
    global _active
    _active = None
    ms.set_context(enable_compile_cache=False)
