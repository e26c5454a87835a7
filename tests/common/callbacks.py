"""Shared helpers for callback tests: Model's callback parameters faked, parameters snapshotted, records read."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from mindspore.train import Callback


class Params(dict):
    """A stand-in for Model's callback parameters: a dict whose keys read as attributes."""

    __getattr__ = dict.__getitem__

    def __setattr__(self, key, value):
        self[key] = value


class Snapshots(Callback):
    """Every parameter of the train network at each epoch end (``by_epoch``) and, with ``every_step=True``,
    after every step (``by_step``: 1-based global step), as NumPy copies."""

    def __init__(self, every_step: bool = False):
        super().__init__()
        self.every_step = every_step
        self.by_epoch = {}
        self.by_step = {}

    def on_train_step_end(self, run_context):
        if self.every_step:
            params = run_context.original_args()
            self.by_step[int(params.cur_step_num)] = _parameters(params.train_network)

    def on_train_epoch_end(self, run_context):
        params = run_context.original_args()
        self.by_epoch[params.cur_epoch_num] = _parameters(params.train_network)


def _parameters(network) -> dict:
    return {p.name: p.asnumpy().copy() for p in network.get_parameters()}


def read_jsonl(path: Path) -> List[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
