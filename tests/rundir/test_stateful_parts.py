"""The registry of stateful parts: names, JSON round trips (NaN and infinities included), a checkpoint's entry, and
what a resume does with missing or unknown parts. Pure logic: no MindSpore graph, no process."""
import json
import logging
import math
import random

import pytest

from trainkit.errors import CheckpointError, ConfigError
from trainkit.rundir.stateful_parts import CHECKPOINT_KEY, StatefulParts, is_stateful, parts_of


class Counter:
    def __init__(self, value=None):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def random_value(rng, depth=0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([0.0, -0.0, 1e-310, 1.5e308, float("nan"), float("inf"), -float("inf"), rng.random()])
    if kind == 1:
        return rng.randrange(-10**12, 10**12)
    if kind == 2:
        return "".join(rng.choice("ab{}$\\\"'\n é") for _ in range(rng.randrange(6)))
    if kind == 3:
        return rng.choice([None, True, False])
    if kind == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def same(a, b):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


def test_every_value_json_can_hold_comes_back_as_it_was_nan_and_infinities_included():
    rng = random.Random(0)
    for _ in range(300):
        value = random_value(rng)
        parts = StatefulParts()
        parts.register("part", Counter(value))
        entries = parts.checkpoint_entries()
        restored = Counter()
        again = StatefulParts()
        again.register("part", restored)
        again.load(parts_of(entries, "checkpoint x"), "checkpoint x")
        assert same(restored.value, value), value


def test_a_resume_restores_each_part_by_name_and_says_which_start_afresh(caplog):
    saved = StatefulParts()
    saved.register("early_stopping", Counter(3))
    saved.register("callbacks/Tally", Counter([1, 2]))
    stored = parts_of(saved.checkpoint_entries(), "c")
    now = StatefulParts()
    early, tally, new = Counter(), Counter(), Counter("initial")
    now.register("callbacks/Tally", tally)
    now.register("early_stopping", early)
    now.register("callbacks/New", new)
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        now.load(stored, "checkpoint c.ckpt")
    assert (early.value, tally.value, new.value) == (3, [1, 2], "initial")
    assert "checkpoint c.ckpt holds no state for callbacks/New" in caplog.text
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        StatefulParts().load(stored, "checkpoint c.ckpt")
    assert "holds state for callbacks/Tally, early_stopping, which this run does not have" in caplog.text


def test_an_older_checkpoint_without_parts_starts_every_part_afresh_in_one_line(caplog):
    parts = StatefulParts()
    parts.register("a", Counter(1))
    parts.register("b", Counter(2))
    assert parts_of({"micro_steps": 3}, "c") is None
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        parts.load(None, "checkpoint old.ckpt")
    assert len(caplog.records) == 1 and "holds no state for a, b" in caplog.text


def test_bad_parts_and_bad_entries_are_one_line_each():
    parts = StatefulParts()
    with pytest.raises(ValueError, match="must define state_dict"):
        parts.register("x", object())
    parts.register("x", Counter(1))
    with pytest.raises(ValueError, match="already registered as 'x'"):
        parts.register("x", Counter(2))
    parts.register("y", Counter(object()))
    with pytest.raises(TypeError, match=r"Counter.state_dict\(\) \(part y\) is not JSON data"):
        parts.checkpoint_entries()
    for planted in ("[1, 2]", "{", "[" * 100000 + "]" * 100000, '{"a": ' * 50000 + "1" + "}" * 50000):
        with pytest.raises(CheckpointError, match="not a JSON object"):
            parts_of({CHECKPOINT_KEY: planted}, "checkpoint c")
    strict = StatefulParts()
    strict.register("x", Counter())
    with pytest.raises(ConfigError, match="the stored state of x does not fit"):
        strict.load({"x": {"other": 1}}, "checkpoint c")
    assert not is_stateful(Counter.state_dict)


def test_the_entry_is_plain_json_with_sorted_keys():
    parts = StatefulParts()
    parts.register("b", Counter(float("nan")))
    parts.register("a", Counter(1))
    text = parts.checkpoint_entries()[CHECKPOINT_KEY]
    assert json.loads(text) == {"a": {"value": 1}, "b": {"value": {"__float__": "nan"}}}
