"""Callbacks a user would write, built by the app from `_target_` in the tests of trainkit.Callback."""
from __future__ import annotations

import os
import signal

from mindspore.train import Callback as MindSporeCallback

from trainkit import Callback


class Recorder(Callback):
    """Keeps what every hook saw and logs values of its own; writes each epoch end to a CSV in the run dir."""

    def __init__(self, stop_at_step: int = 0):
        super().__init__()
        self.stop_at_step = stop_at_step
        self.started, self.steps, self.epochs, self.ended = [], [], [], []
        self.objects = None

    def on_run_start(self, state):
        self.started.append((state.step, state.epoch, state.learning_rate))
        self.objects = (state.network, state.wrapper, state.optimizer, state.run_dir, state.rank, state.writer)

    def on_step_end(self, state):
        self.steps.append((state.step, state.optimizer_step, state.epoch, state.step_in_epoch, state.learning_rate))
        self.log("custom/learning_rate", state.learning_rate)
        if state.step == self.stop_at_step:
            os.kill(os.getpid(), signal.SIGTERM)  # a polite stop: trainkit stops after the next step

    def on_epoch_end(self, state):
        self.epochs.append((state.epoch, state.step, dict(state.evaluation)))
        self.log("custom/epoch_accuracy", state.evaluation["eval/accuracy"])
        with open(state.run_dir / "epochs.csv", "a") as csv:
            csv.write(f"{state.epoch},{state.step}\n")

    def on_run_end(self, state):
        self.ended.append(state.step)
        self.log("custom/ended", state.step)
        self.log("custom/not_a_number", float("nan"))  # recorded as such, as trainkit's own values are
        self.log("custom/infinite", -float("inf"))


class LogsText(Callback):
    """Logs a string at the first step: the run stops with one line naming the callback and the name."""

    def on_step_end(self, state):
        self.log("custom/mood", "high")


class CountSteps(MindSporeCallback):
    """A plain MindSpore callback: it keeps working beside trainkit's."""

    def __init__(self):
        super().__init__()
        self.steps = 0
        self.epoch_ends = 0
        self.step_numbers = []

    def on_train_step_end(self, run_context):
        self.steps += 1
        self.step_numbers.append(run_context.original_args().cur_step_num)

    def on_train_epoch_end(self, run_context):
        self.epoch_ends += 1
