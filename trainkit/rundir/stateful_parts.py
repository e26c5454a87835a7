"""The registry of a run's stateful parts: every part with Python state saves and restores itself.

A checkpoint holds the train network's Parameters (weights, optimizer, EMA, loss scale, accumulation buffers: the
TrainingWrapper saves them) and the run's position (the data and the random streams follow from it). State that
lives in Python objects -- early stopping's best value and patience count, ``best.ckpt``'s best so far, the records'
partial interval, what the data module fitted, a user callback's counters -- is in no Parameter. Each such part
registers here under a stable name with ``state_dict() -> dict`` and ``load_state_dict(state)`` (Lightning's
``Callback.state_dict``, accelerate's ``register_for_checkpointing``); every checkpoint the run writes appends the
registry's state as one JSON entry (:data:`CHECKPOINT_KEY`), and a resume gives each part its own state back
before the first step.

A part whose state the checkpoint does not hold (a checkpoint written before the part existed, or before trainkit
saved parts) starts from its initial state, and the run says so in one line naming the part (docs/checkpoints.md
lists each part and that default).
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any, Dict, Iterator, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

from trainkit.errors import CheckpointError, ConfigError, TrainingError

log = logging.getLogger("trainkit")

#: The checkpoint entry holding ``{part name: its state_dict()}`` as JSON.
CHECKPOINT_KEY = "trainkit_parts"
#: The largest JSON text the parts may append to one checkpoint (a part that keeps a history belongs in a file).
MAX_STATE_BYTES = 16 * 1024 * 1024


@runtime_checkable
class Stateful(Protocol):
    """A part that saves and restores itself."""

    def state_dict(self) -> Dict[str, Any]:
        ...

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        ...


def is_stateful(part: Any) -> bool:
    """Whether `part` defines both ``state_dict`` and ``load_state_dict`` (callables)."""
    return callable(getattr(part, "state_dict", None)) and callable(getattr(part, "load_state_dict", None))


class PartStateError(TrainingError, TypeError):
    """A part's ``state_dict()`` is not JSON data: the run stops with this one line naming the part."""


class StatefulParts:
    """Named stateful parts, in registration order; what checkpoints append and resumes restore."""

    def __init__(self) -> None:
        self._parts: Dict[str, Stateful] = {}

    def register(self, name: str, part: Any) -> None:
        """Register `part` under `name` (unique, stable across runs of the same config).

        Raises:
            ValueError: `name` is empty or taken, or `part` lacks ``state_dict``/``load_state_dict``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a stateful part's name must be a non-empty string; got {name!r}")
        if name in self._parts:
            raise ValueError(f"a stateful part is already registered as {name!r}")
        if not is_stateful(part):
            raise ValueError(f"{type(part).__name__} registered as {name!r} must define state_dict() and "
                             "load_state_dict(state)")
        self._parts[name] = part

    def __contains__(self, name: str) -> bool:
        return name in self._parts

    def __iter__(self) -> Iterator[Tuple[str, Stateful]]:
        return iter(self._parts.items())

    def names(self) -> Tuple[str, ...]:
        return tuple(self._parts)

    def state_dict(self) -> Dict[str, Dict[str, Any]]:
        """Every part's state now, checked to be JSON data (a part that returns something else is named)."""
        states = {}
        for name, part in self._parts.items():
            state = part.state_dict()
            if not isinstance(state, dict):
                raise PartStateError(f"{type(part).__name__}.state_dict() (part {name}) must return a dict; got "
                                     f"{type(state).__name__}")
            states[name] = state
        return states

    def checkpoint_entries(self) -> Dict[str, str]:
        """What a checkpoint appends: the parts' state as one JSON text (nothing when no part is registered)."""
        if not self._parts:
            return {}
        states = self.state_dict()
        for name, state in states.items():
            try:
                json.dumps(_tagged(state), allow_nan=False)
            except (TypeError, ValueError, RecursionError) as error:
                raise PartStateError(
                    f"{type(self._parts[name]).__name__}.state_dict() (part {name}) is not JSON data ({error}): it "
                    "must return dicts with string keys, lists, strings, numbers, booleans and None") from None
        text = json.dumps(_tagged(states), allow_nan=False, sort_keys=True)
        if len(text) > MAX_STATE_BYTES:
            raise PartStateError(f"the stateful parts' state is {len(text):,} bytes, more than {MAX_STATE_BYTES:,}: "
                                 "keep a history in a file of your own, not in state_dict()")
        return {CHECKPOINT_KEY: text}

    def load(self, stored: Optional[Mapping[str, Any]], source: str, skip: Sequence[str] = (),
             report_missing: bool = True) -> None:
        """Give each part its state from `stored` (:func:`parts_of` a checkpoint); a part the checkpoint holds no
        state for starts from its initial state, said in one line. State for a part this run does not have is
        ignored with one line (a callback removed from the config). Parts named in `skip` were given their state
        already (the app restores some parts before it writes anything) and are left as they are; with
        `report_missing` False the parts without state are not said here (a later load of the whole registry
        says them in one line)."""
        stored = dict(stored or {})
        missing = [name for name in self._parts if name not in stored and name not in skip]
        if missing and report_missing:
            log.warning("%s holds no state for %s (written before trainkit saved it, or by a run without it): "
                        "%s from the initial state", source, ", ".join(missing),
                        "it starts" if len(missing) == 1 else "they start")
        for name, part in self._parts.items():
            if name not in stored or name in skip:
                continue
            state = stored[name]
            if not isinstance(state, dict):
                raise CheckpointError(f"{source}: the state of {name} is not a JSON object")
            try:
                part.load_state_dict(state)
            except (KeyError, TypeError, ValueError) as error:
                kind = getattr(part, "part_kind", None) or type(part).__name__
                raise ConfigError(f"{source}: the stored state of {name} does not fit this run's {kind} "
                                  f"({type(error).__name__}: {error})") from error
        unknown = sorted(set(stored) - set(self._parts))
        if unknown:
            log.warning("%s holds state for %s, which this run does not have: ignored", source, ", ".join(unknown))


def stored_value(state: Mapping[str, Any], key: str, kind: str, *, minimum: Optional[float] = None,
                 optional: bool = False) -> Any:
    """``state[key]`` checked as a part's stored state must be: a checkpoint is data someone may have made, so a
    value of another type (a bool for a number, text for a count) or below `minimum` raises ValueError naming the
    key (the registry turns it into one line). `kind`: ``int``, ``float`` (an int is taken as one; NaN and the
    infinities are floats), ``str``, ``floats`` (a list of floats). `optional`: None is taken as it is."""
    value = state[key]
    if value is None and optional:
        return None

    def number(item: Any, integer: bool) -> Any:
        if isinstance(item, bool) or not isinstance(item, int if integer else (int, float)):
            raise ValueError(f"{key} is {item!r}, not {'an integer' if integer else 'a number'}")
        if minimum is not None and not item >= minimum:
            raise ValueError(f"{key} is {item!r}, less than {minimum}")
        return item if integer else float(item)

    if kind == "int":
        return number(value, True)
    if kind == "float":
        return number(value, False)
    if kind == "floats":
        if not isinstance(value, list):
            raise ValueError(f"{key} is {type(value).__name__}, not a list of numbers")
        return [number(item, False) for item in value]
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{key} is {value!r}, not text")
        return value
    raise ValueError(f"unknown kind {kind!r}")


def parts_of(entries: Mapping[str, Any], source: str) -> Optional[Dict[str, Any]]:
    """The parts' state a checkpoint's appended `entries` hold (``{name: state}``), or None for a checkpoint
    written before trainkit saved them."""
    text = entries.get(CHECKPOINT_KEY)
    if text is None:
        return None
    text = text.asnumpy().item() if hasattr(text, "asnumpy") else text
    try:
        state = _untagged(json.loads(str(text)))
    except (ValueError, RecursionError):  # not JSON, or nested deeper than any part writes
        state = None
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: its {CHECKPOINT_KEY} entry is not a JSON object (the file was edited)")
    return state


# JSON has no NaN or infinity: a part's value may be one (a best loss that never became finite), so they are
# written as {"__float__": "nan"} and read back as floats.
_FLOAT_TAG = "__float__"


def _tagged(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT_TAG: repr(value)}
    if isinstance(value, dict):
        return {str(key): _tagged(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tagged(item) for item in value]
    return value


def _untagged(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_FLOAT_TAG} and value[_FLOAT_TAG] in ("nan", "inf", "-inf"):
            return float(value[_FLOAT_TAG])
        return {key: _untagged(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_untagged(item) for item in value]
    return value
