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


def test_trainkits_own_callbacks_and_the_users_run_in_the_order_their_classes_declare():
    """The real classes' declarations alone fix the order, whichever callbacks a run has and in whatever order they
    were made; the users' keep the callbacks list's order among themselves. The expected order is written out here:
    it is the order the app ran them in when append order decided it (StartAt, TrainMetrics, Progress,
    NonFiniteStop, Evaluation, BestCheckpoint, EarlyStopping, the users, PeriodicCheckpoint, SignalStop, and the
    profiler appended last). Mutations caught: any class's run_after shortened to what it needs semantically (e.g.
    Evaluation's back to ("train_metrics",): a shuffle puts it before Progress); the profiler without a role."""
    from mindspore.train import Callback as MindSporeCallback

    from trainkit import Callback
    from trainkit.app.profiling import ProfileWindow
    from trainkit.callbacks import BestCheckpoint, Evaluation, NonFiniteStop, Progress, TrainMetrics
    from trainkit.callbacks.early_stopping import EarlyStopping
    from trainkit.callbacks.signal_stop import SignalStop
    from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint, StartAt

    class UserA(Callback):
        pass

    class UserB(Callback):
        pass

    class Plain(MindSporeCallback):  # declares nothing: a user's plain MindSpore callback
        pass

    own = [StartAt, TrainMetrics, Progress, NonFiniteStop, Evaluation, BestCheckpoint, EarlyStopping,
           PeriodicCheckpoint, SignalStop, ProfileWindow]
    users = [UserA, Plain, UserB]  # the callbacks list's order
    expected = ["StartAt", "TrainMetrics", "Progress", "NonFiniteStop", "Evaluation", "BestCheckpoint",
                "EarlyStopping", "UserA", "Plain", "UserB", "PeriodicCheckpoint", "SignalStop", "ProfileWindow"]
    rng = random.Random(0)
    for case in range(300):
        # every run has StartAt and TrainMetrics; the first case is the full set
        present = own if case == 0 else own[:2] + [c for c in own[2:] if rng.random() < 0.7]
        present_users = users if case == 0 else [u for u in users if rng.random() < 0.6]
        made = [cls.__new__(cls) for cls in present]  # instances carry their class's declarations, nothing more
        rng.shuffle(made)
        last = -1
        for user in present_users:  # interleaved anywhere, their own order kept
            last = rng.randrange(last + 1, len(made) + 1)
            made.insert(last, user.__new__(user))
        names = [type(callback).__name__ for callback in sort_callbacks(made)]
        kept = {cls.__name__ for cls in present + present_users}
        assert names == [name for name in expected if name in kept], case
