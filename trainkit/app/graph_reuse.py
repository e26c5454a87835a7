"""A sweep's jobs in one process share compiled graphs: a job whose graph key is the last job's trains the cells
that job compiled, with its own starting values copied into their Parameters.

MindSpore keeps a compiled graph with the Cell instance it was compiled for (``cells_compile_cache``, by the cell's
id), so a job that builds new cells compiles them again, and its compile cache cannot help there: MindSpore reads
the cache folder once per process and numbers the graphs by their order of compile in the process
(``compile_cache_manager.cc``), so only a process's first job can load graphs from a folder. What Hydra's basic
launcher and trainkit's run one after another in one process can share instead are the compiled cells themselves.

A job builds everything as usual (weights from its seed, its learning-rate table, a new optimizer state: its own
cells, never run) and then, when the last completed job of this process had the same key
(:func:`trainkit.app.compile_cache.cache_key`, whose :data:`~trainkit.app.compile_cache.GRAPH_DATA_KEYS` are the
values that only reach the graphs as data), copies every Parameter of its new cells into the kept ones and trains
those. Where the two sets of Parameters differ in names, shapes or types the new cells are used and compiled.
The same switches as the compile cache turn it off (``TRAINKIT_COMPILE_CACHE=0``, a data-parallel worker).

The key here leaves out ``trainer.seed`` too (``sweep.repeats`` runs each configuration with several seeds): a
seed reaches the graphs as data (the starting weights, copied in) except where the graphs hold something drawn from
it as a constant. So a job of another seed shares only when (:func:`seed_free`) the kept train and evaluation
graphs have no random operator (MindSpore's dropouts and samplers take their seeds as constants at compile time,
whether built as layers or called as functions in ``construct``), every cell is MindSpore's or trainkit's (other
code may draw from the seed as it compiles, where nothing shows it), and every constant the cells hold (Tensors that
are not Parameters, NumPy arrays, numbers: trainkit's ``Dropout`` salt, a mask a model drew in ``__init__``) is
equal in the two jobs' cells. Anything else compiles its own cells.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, fields
from typing import Any, Iterator, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn
from omegaconf import DictConfig

from trainkit.app import compile_cache
from trainkit.distributed.parallel import launched_by_msrun
from trainkit.step.in_place import assign_in_place

log = logging.getLogger("trainkit")


@dataclass
class CompiledCells:
    """The cells a run compiles graphs for, and those that share their Parameters (all kept together)."""

    backbone: nn.Cell
    loss_network: nn.Cell
    optimizer: nn.Optimizer
    wrapper: nn.Cell
    eval_network: Optional[nn.Cell]  # None with trainer.evaluate=false


_kept: Optional[Tuple[str, CompiledCells, Any]] = None  # the last completed job's key, cells and seed
_job: List[Optional[str]] = [None]  # the key of the job running now, inside sharing()
_seed: List[Any] = [None]  # the seed of the job running now
_built: List[Optional[CompiledCells]] = [None]  # the cells the job running now trains


def key_of(cfg: DictConfig) -> Optional[str]:
    """The graph key of `cfg` where cells may be shared: None where the compile cache is off, in a data-parallel
    worker, and for a run that resumes (its checkpoint is loaded with ``set_data``, fine before a compile only)."""
    if compile_cache.cache_root() is None or launched_by_msrun() or cfg.trainer.get("resume") is not None:
        return None
    try:
        return compile_cache.cache_key(cfg, data_keys=("trainer.seed",))
    except Exception as error:  # noqa: BLE001 -- bad input is the run's to report, with its own message
        log.debug("graph sharing off for this job: %s", error)
        return None


@contextlib.contextmanager
def sharing(key: Optional[str]) -> Iterator[None]:
    """Inside, :func:`reuse` may hand the run the cells the last job of this process compiled under `key`; a run
    that completes leaves its cells for the next job. A failed run leaves none (its cells may be half-way)."""
    global _kept
    _job[0], _built[0], _seed[0] = key, None, None
    try:
        yield
    except BaseException:
        _kept = None
        raise
    else:
        if key is not None and _built[0] is not None:
            _kept = (key, _built[0], _seed[0])
    finally:
        _job[0], _built[0], _seed[0] = None, None, None


def reuse(cells: CompiledCells) -> CompiledCells:
    """The kept cells with the values of `cells` copied into them where the job's key is the kept one's and the
    Parameters agree; else `cells` (compiled as usual)."""
    key = _job[0]
    if key is None:
        return cells
    _seed[0] = ms.get_seed()  # the run's trainer.seed, set before its cells were built
    chosen = cells
    if _kept is not None and _kept[0] == key:
        pairs = _parameter_pairs(_kept[1], cells)
        if pairs is not None and _kept[2] != ms.get_seed() and not seed_free(_kept[1], cells):
            log.info("graph sharing: not with the last job: its graphs hold something drawn from its seed (a random "
                     "operator or a constant), so this job of another seed compiles its own")
            pairs = None
        if pairs is not None:
            for kept, new in pairs:
                assign_in_place(kept, new.asnumpy())
            chosen = _kept[1]
            log.info("graph sharing: this job runs the graphs the last job compiled (same graph key %s; %d "
                     "parameters set to this job's values)", key[:12], len(pairs))
    _built[0] = chosen
    return chosen


def seed_free(kept: CompiledCells, new: CompiledCells) -> bool:
    """Whether `new` (built under another seed) may run `kept`'s compiled graphs: every cell MindSpore's or
    trainkit's (:data:`KNOWN_CODE`), no random operator or call of another graph in them, and every constant of
    the cells equal. False where the graphs cannot be read."""
    foreign = sorted({f"{type(cell).__module__}.{type(cell).__qualname__}" for cell in _cells(new)
                      if not type(cell).__module__.startswith(KNOWN_CODE)})
    if foreign:
        log.debug("graph sharing: another seed compiles: %s's construct may draw from the seed as it compiles",
                  foreign[0])
        return False
    operators = _random_operators(kept)
    if operators != set():
        log.debug("graph sharing: the kept graphs' random operators: %s", operators or "unreadable")
        return False
    for field in fields(CompiledCells):
        a, b = getattr(kept, field.name), getattr(new, field.name)
        if (a is None) != (b is None):
            return False
        if a is not None:
            kept_constants, new_constants = _constants(a), _constants(b)
            differ = [x[0] for x, y in zip(kept_constants, new_constants) if x != y]
            if differ or len(kept_constants) != len(new_constants):
                log.debug("graph sharing: constants differ: %s", differ[:5])
                return False
    return True


def _cells(cells: CompiledCells) -> Iterator[nn.Cell]:
    for field in fields(CompiledCells):
        cell = getattr(cells, field.name)
        if cell is not None:
            for _, sub in cell.cells_and_names():
                yield sub


def _random_operators(cells: CompiledCells) -> Optional[set]:
    """The random operators of every graph compiled for the cells (None where one cannot be read)."""
    from mindspore.graph import api
    from mindspore.train import anf_ir_pb2

    found: set = set()
    for cell in (cells.wrapper, cells.eval_network):
        if cell is None:
            continue
        phases = api.cells_compile_cache.get(id(cell), ())
        if not phases:
            return None  # never compiled (or compiled under a key MindSpore no longer keeps): nothing to vouch for
        for phase in phases:
            try:
                model = anf_ir_pb2.ModelProto()
                model.ParseFromString(api._cell_graph_executor._get_func_graph_proto(cell, phase, "anf_ir"))
            except Exception as error:  # noqa: BLE001 -- unreadable: not shared
                log.debug("graph sharing: %s's graph %s unreadable: %s", type(cell).__name__, phase, error)
                return None
            for node in model.graph.node:
                names = {attribute.name for attribute in node.attribute}
                # A call of another graph (control flow: Switch, Partial, a nameless call node) is not looked into.
                if node.op_type in _RANDOM or node.op_type in _SUBGRAPH_CALLS or not node.op_type \
                        or "side_effect_hidden" in names or "random_cache" in names:
                    found.add(node.op_type or "an operator without a name")
    return found


def _random_operator_names() -> frozenset:
    from mindspore.ops import Primitive
    from mindspore.ops.operations import nn_ops, random_ops

    names = {name for name, value in vars(random_ops).items()
             if isinstance(value, type) and issubclass(value, Primitive) and value.__module__ == random_ops.__name__}
    names |= {name for name in vars(nn_ops) if "Dropout" in name or "Random" in name}
    return frozenset(names | {"Bernoulli", "Randperm", "RandInt", "RandLikeExt", "RandnLike", "Randn", "Rand"})


_RANDOM = _random_operator_names()
# Cells whose construct is known to draw nothing from the seed while it compiles. Any other code may (NumPy's
# random in construct, ``ms.get_seed()``): MindSpore folds such a draw into a constant no check here can see.
KNOWN_CODE: Tuple[str, ...] = ("mindspore.", "trainkit.")
_SUBGRAPH_CALLS = frozenset({"Partial", "Switch", "SwitchLayer", "call"})


_BOOKKEEPING = frozenset(vars(nn.Cell()))  # what MindSpore's Cell keeps of itself (its creation time, its id)


def _constants(cell: nn.Cell) -> List[Tuple[str, str, bytes]]:
    """The values a graph reads as constants from `cell` and the cells under it: Tensors that are not Parameters,
    NumPy arrays and numbers, by path (what a model draws from the seed and keeps outside its Parameters)."""
    out = []
    for path, sub in cell.cells_and_names():
        for name, value in sorted(vars(sub).items()):
            if name in _BOOKKEEPING or isinstance(value, (Parameter, nn.Cell)):
                continue
            if isinstance(value, Tensor):
                out.append((f"{path}.{name}", str(value.dtype), value.asnumpy().tobytes()))
            elif isinstance(value, np.ndarray):
                out.append((f"{path}.{name}", str(value.dtype), value.tobytes()))
            elif isinstance(value, (int, float, np.generic)) and not isinstance(value, bool):
                out.append((f"{path}.{name}", type(value).__name__, repr(value).encode()))
    return out


def forget() -> None:
    """Drop the kept cells (tests; a process that wants its memory back)."""
    global _kept
    _kept = None


def _parameters(cells: CompiledCells) -> List[Tuple[str, Parameter]]:
    """Every Parameter the cells hold, once each, in a fixed order with the path that names it."""
    seen, out = set(), []
    for field in fields(CompiledCells):
        cell = getattr(cells, field.name)
        if cell is None:
            continue
        for name, parameter in cell.parameters_and_names():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                out.append((f"{field.name}.{name}", parameter))
    return out


def _parameter_pairs(kept: CompiledCells, new: CompiledCells) -> Optional[List[Tuple[Parameter, Parameter]]]:
    """(kept, new) Parameters matched by path, or None where names, shapes, types or flags differ."""
    if (kept.eval_network is None) != (new.eval_network is None):
        return None
    old, fresh = _parameters(kept), _parameters(new)
    if [name for name, _ in old] != [name for name, _ in fresh]:
        return None
    pairs = []
    for (name, a), (_, b) in zip(old, fresh):
        if a.shape != b.shape or a.dtype != b.dtype or a.requires_grad != b.requires_grad or a.name != b.name:
            log.debug("graph sharing: %s differs (%s %s against %s %s)", name, a.shape, a.dtype, b.shape, b.dtype)
            return None
        pairs.append((a, b))
    return pairs
