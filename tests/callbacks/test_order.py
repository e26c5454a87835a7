"""The callbacks' declared order: a stable topological sort over roles (pure logic, fake callbacks)."""
import itertools
import random

import pytest

from trainkit.callbacks.order import role_of, sort_callbacks


class Fake:
    def __init__(self, role=None, after=()):
        if role is not None:
            self.order_role = role
        self.run_after = after

    def __repr__(self):
        return f"Fake({getattr(self, 'order_role', 'user')})"


TRAINKIT = [("start_at", ()), ("train_metrics", ("start_at",)), ("progress", ("train_metrics",)),
            ("evaluation", ("train_metrics",)), ("best_checkpoint", ("evaluation",)),
            ("early_stopping", ("evaluation", "best_checkpoint")),
            ("training_checkpoint", ("train_metrics", "evaluation", "best_checkpoint", "early_stopping", "user")),
            ("signal_stop", ("training_checkpoint", "user"))]


def satisfied(order):
    """Each callback comes after every callback of each role it names (checked pair by pair)."""
    for i, callback in enumerate(order):
        for later in order[i + 1:]:
            if role_of(later) in callback.run_after and role_of(later) != role_of(callback):
                return False
    return True


def test_any_append_order_sorts_into_one_that_honours_every_declaration():
    rng = random.Random(0)
    for _ in range(200):
        callbacks = [Fake(role, after) for role, after in TRAINKIT]
        callbacks += [Fake(None, ("evaluation", "best_checkpoint", "early_stopping")) for _ in range(rng.randrange(3))]
        callbacks += [Fake(None, ()) for _ in range(rng.randrange(2))]  # a plain MindSpore callback of the user's
        rng.shuffle(callbacks)
        order = sort_callbacks(callbacks)
        assert sorted(map(id, order)) == sorted(map(id, callbacks)) and satisfied(order)
        users = [c for c in order if role_of(c) == "user"]
        checkpoint = next(c for c in order if role_of(c) == "training_checkpoint")
        assert all(order.index(u) < order.index(checkpoint) for u in users)  # the checkpoint holds their state


def test_callbacks_without_declarations_keep_the_given_order():
    for count in range(1, 6):
        for permutation in itertools.permutations(range(count)):
            callbacks = [Fake(f"r{i}") for i in permutation]
            assert sort_callbacks(callbacks) == callbacks


def test_a_cycle_is_one_error_naming_the_callbacks():
    with pytest.raises(ValueError, match="form a cycle"):
        sort_callbacks([Fake("a", ("b",)), Fake("b", ("a",))])
