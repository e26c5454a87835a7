"""The order a run's callbacks run in: declared by each callback, not implied by the order they were appended in.

Each callback may name its role (``order_role``) and the roles it must run after (``run_after``), as Lightning's
``_reorder_callbacks`` does for checkpoints. :func:`sort_callbacks` puts every callback after all callbacks of the
roles it names, and otherwise keeps the order it was given (a stable topological sort). A callback that declares
nothing (a plain ``mindspore.train.Callback``) has the role ``user`` and runs after :data:`USER_RUNS_AFTER`, as a
``trainkit.Callback`` does: after the epoch's evaluation, ``best.ckpt`` and early stopping, and the epoch's
checkpoint is written after it, so the checkpoint holds its state.

trainkit's own callbacks (all ``trainkit.Callback``) each name every role before their own, so their order follows
from the declarations alone, whichever of them a run has and in whatever order they were made: ``start_at``,
``train_metrics``, ``progress``, ``nonfinite_stop``, ``evaluation``, ``best_checkpoint``, ``early_stopping``,
``user``, ``training_checkpoint``, ``signal_stop``, ``profiler``. Callbacks of one role (the users') keep the
order they were given (the ``callbacks`` list's).
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

USER = "user"
#: The roles a user's callback runs after (``trainkit.Callback.run_after``, and a callback that declares nothing).
USER_RUNS_AFTER = ("start_at", "train_metrics", "progress", "nonfinite_stop", "evaluation", "best_checkpoint",
                   "early_stopping")


def role_of(callback: Any) -> str:
    """The callback's declared role, ``user`` when it declares none."""
    role = getattr(callback, "order_role", None)
    return role if isinstance(role, str) and role else USER


def runs_after(callback: Any) -> Tuple[str, ...]:
    """The roles `callback` must run after (:data:`USER_RUNS_AFTER` when it declares neither role nor order)."""
    if not hasattr(callback, "run_after"):
        return USER_RUNS_AFTER if role_of(callback) == USER else ()
    after = getattr(callback, "run_after", ())
    return (after,) if isinstance(after, str) else tuple(after or ())


def sort_callbacks(callbacks: Sequence[Any]) -> List[Any]:
    """`callbacks`, each after every callback whose role it names in ``run_after``; ties keep the given order.

    Raises:
        ValueError: the declarations form a cycle (names the callbacks in it).
    """
    pending = list(callbacks)
    placed: List[Any] = []
    while pending:
        roles_pending = [role_of(callback) for callback in pending]
        for index, callback in enumerate(pending):
            waiting_for = set(runs_after(callback)) - {role_of(callback)}
            if not any(role in waiting_for for other, role in enumerate(roles_pending) if other != index):
                placed.append(pending.pop(index))
                break
        else:
            names = ", ".join(f"{type(c).__name__} (after {', '.join(runs_after(c))})" for c in pending)
            raise ValueError(f"the callbacks' run_after declarations form a cycle: {names}")
    return placed
