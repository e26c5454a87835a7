"""The Hydra app: compose a config, check it, build every part from it and run it with ``mindspore.train.Model``.

``training`` (``train(cfg)``), ``run_loop`` (the ``Run``: its parts, their registry and the loop), ``plan`` (the
config resolved once: ``RunPlan``, ``StepPlan``), ``config`` (schemas, groups, ``compose_config``, value checks),
``targets`` (``_target_`` keys against signatures), ``build`` (each part from the config), ``fit_check`` (one
batch before compiling), ``run`` (run directory, context, resume, reporting), ``stopping`` (signals, early
stopping, continuation), ``finetune``, ``profiling``, ``tool_config`` (the network and data the tools build, as a
run would) and ``sweep`` (a subpackage: a ``-m`` sweep's records, summary, plot and launcher).

Import rule: the app may import every wing below it (callbacks, distributed, rundir, step, models, data, parts,
kernels, checks, process, errors); nothing below imports the app, and the app imports neither ``bridge`` nor ``tools``.

``train`` and ``compose_config`` are loaded on first use, so that importing ``trainkit.app.config`` (as
``python -m trainkit`` does before it sets MindSpore's log level) does not import MindSpore.
"""
from typing import Any

__all__ = ["train", "compose_config"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from trainkit.app.training import train

        return train
    if name == "compose_config":
        from trainkit.app.config import compose_config

        return compose_config
    raise AttributeError(f"module 'trainkit.app' has no attribute {name!r}")
