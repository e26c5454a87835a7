"""Processes: ``launch`` runs the same command on N workers through ``msrun`` (``msrun_job`` follows one msrun job;
``rendezvous`` and ``machines``: the launchers of several machines meet and prepare their run directories);
``parallel`` is what each worker does (its parallel context, communication init, data prepared on rank 0 first,
learning-rate scaling); ``agreement``: every rank starts from the same step, weights and config, or none trains.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import the run directory,
the parts, ``kernels`` and the foundation; never the callbacks, the app, the bridge or the tools (the app calls into
it, never the reverse).
"""
from typing import Any

__all__ = ["current_setup"]


def __getattr__(name: str) -> Any:
    if name == "current_setup":
        from trainkit.distributed.parallel import current_setup

        return current_setup
    raise AttributeError(f"module 'trainkit.distributed' has no attribute {name!r}")
