"""A part's stored state is data someone may have made: trainkit's own parts (early stopping, the records'
interval, best.ckpt's best so far) take back a state only when each value has the type and range a run writes, and
refuse any other in one line naming the key, through the registry a resume uses. A seeded generator plants hostile
values in every key."""
import math
import random
from types import SimpleNamespace

import pytest

from trainkit.callbacks.best_checkpoint import BestCheckpoint
from trainkit.callbacks.early_stopping import EarlyStopping
from trainkit.callbacks.train_metrics import TrainMetrics
from trainkit.errors import ConfigError
from trainkit.rundir.stateful_parts import StatefulParts

HOSTILE = [True, False, -1, -10**6, 1.5, float("nan"), float("inf"), "3", "abc", None, [], [1, "x"], [True],
           {"a": 1}, 0, 7, 2.0, [0.5, float("nan")], 10**20]


def early():
    return EarlyStopping(SimpleNamespace(metric_names=None, history=[]), "eval/loss", mode="min", patience=3)


def metrics():
    return TrainMetrics(None, samples_per_step=1)


def best():  # a directory that does not exist: no best.json to start from, and nothing is written by a load
    return BestCheckpoint(SimpleNamespace(metric_names=None, history=[]), "/nonexistent/checkpoints",
                          metric="eval/accuracy", mode="max")


VALID = {
    "early_stopping": (early, {"metric": "eval/loss", "mode": "min", "best": 0.5, "best_epoch": 2,
                               "bad_evaluations": 1}),
    "train_metrics": (metrics, {"last_record_step": 10, "losses": [0.5, 0.25], "grad_norms": [1.0], "scale": 1.0}),
    "best_checkpoint": (best, {"metric": "eval/accuracy", "mode": "max", "best": 0.9, "best_epoch": 3,
                               "best_step": 30}),
}


def acceptable(part, key, value):
    """What a run could have written there, decided here independently of the code."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    rules = {
        ("early_stopping", "metric"): lambda v: isinstance(v, str),
        ("early_stopping", "mode"): lambda v: isinstance(v, str),
        ("early_stopping", "best"): lambda v: v is None or number(v),
        ("early_stopping", "best_epoch"): lambda v: v is None or count(v),
        ("early_stopping", "bad_evaluations"): count,
        ("train_metrics", "last_record_step"): lambda v: v is None or count(v),
        ("train_metrics", "losses"): lambda v: isinstance(v, list) and all(number(x) for x in v),
        ("train_metrics", "grad_norms"): lambda v: isinstance(v, list) and all(number(x) for x in v),
        ("train_metrics", "scale"): lambda v: v is None or number(v),
        ("best_checkpoint", "metric"): lambda v: isinstance(v, str),
        ("best_checkpoint", "mode"): lambda v: v in ("max", "min"),
        ("best_checkpoint", "best"): lambda v: v is None or number(v),
        ("best_checkpoint", "best_epoch"): lambda v: v is None or count(v),
        ("best_checkpoint", "best_step"): lambda v: v is None or count(v),
    }
    return rules[(part, key)](value)


def test_every_planted_value_is_taken_only_when_a_run_could_have_written_it():
    rng = random.Random(0)
    refused = taken = 0
    for _ in range(400):
        name = rng.choice(sorted(VALID))
        make, valid = VALID[name]
        key = rng.choice(sorted(valid))
        value = rng.choice(HOSTILE)
        state = {**valid, key: value}
        parts = StatefulParts()
        part = make()
        parts.register(name, part)
        if acceptable(name, key, value):
            parts.load({name: state}, "checkpoint planted.ckpt")
            taken += 1
        else:
            with pytest.raises(ConfigError, match=f"checkpoint planted.ckpt: the stored state of {name} does not "
                                                  f"fit this run's .*{key}") as caught:
                parts.load({name: state}, "checkpoint planted.ckpt")
            assert "\n" not in str(caught.value)
            refused += 1
    assert refused > 100 and taken > 50


def test_a_valid_state_comes_back_as_written():
    part = early()
    parts = StatefulParts()
    parts.register("early_stopping", part)
    parts.load({"early_stopping": {"metric": "eval/loss", "mode": "min", "best": float("nan"), "best_epoch": None,
                                   "bad_evaluations": 2}}, "c")
    assert math.isnan(part.best) and part.best_epoch is None and part.bad_evaluations == 2
