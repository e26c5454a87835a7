"""The data module's fitted state as the stateful part ``data``: a resume takes a module that fitted the same
statistics, categories and class names as the checkpoint's run (after the JSON round trip a checkpoint makes), and
refuses, in one line naming the part, one that fitted anything else (the training data changed since)."""
import copy
import json
import math
import random

import pytest

from trainkit.errors import ConfigError
from trainkit.rundir.data_state import FittedData
from trainkit.rundir.stateful_parts import StatefulParts, parts_of


def registry(state, names):
    parts = StatefulParts()
    parts.register("data", FittedData("TableData", state, names))
    return parts


def fitted(rng):
    columns = rng.randrange(1, 5)
    return {"means": [rng.uniform(-1e3, 1e3) for _ in range(columns)],
            "stds": [rng.uniform(1e-3, 1e2) for _ in range(columns)],
            "categories": {"colour": ["red", "green", "blue"][:rng.randrange(1, 4)]},
            "fill": rng.choice([float("nan"), 0.0, 1.5])}


def changed(rng, state, names):
    """One thing a changed training file changes: a statistic by one float step, a category, a class name."""
    state, names = copy.deepcopy(state), copy.deepcopy(names)
    what = rng.choice(["mean", "category", "names"] if names else ["mean", "category"])
    if what == "mean":
        i = rng.randrange(len(state["means"]))
        state["means"][i] = math.nextafter(state["means"][i], math.inf)
    elif what == "category":
        state["categories"]["colour"] = state["categories"]["colour"] + ["grey"]
    else:
        names[rng.randrange(len(names))] = "renamed"
    return state, names


def test_the_same_fitted_data_is_taken_and_any_change_is_refused_in_one_line():
    rng = random.Random(0)
    for _ in range(200):
        state = fitted(rng)
        names = rng.choice([None, [f"class{i}" for i in range(rng.randrange(2, 6))]])
        stored = parts_of(registry(state, names).checkpoint_entries(), "checkpoint c.ckpt")  # what a checkpoint holds
        registry(json.loads(json.dumps(state)), names).load(stored, "checkpoint c.ckpt")  # fitted the same again
        other_state, other_names = changed(rng, state, names)
        with pytest.raises(ConfigError, match="checkpoint c.ckpt: the stored state of data does not fit this run's "
                                              "data module .*the training data changed since") as caught:
            registry(other_state, other_names).load(stored, "checkpoint c.ckpt")
        assert "\n" not in str(caught.value)
