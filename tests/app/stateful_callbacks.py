"""Callbacks a user would write with state of their own, built by the app from `_target_` in the exact-resume tests."""
from __future__ import annotations

import os
import signal

from trainkit import Callback


class StopAt(Callback):
    """Sends this process SIGTERM at the end of step `step`: trainkit stops politely after that step."""

    def __init__(self, step: int = 0):
        super().__init__()
        self.step = step

    def on_step_end(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class KillAt(Callback):
    """Sends this process SIGKILL at the end of step `step`, before that step's checkpoint: nothing after it runs
    (no checkpoint there, no file closed, the lock left behind), as when the machine or the OOM killer ends a run."""

    def __init__(self, step: int = 0):
        super().__init__()
        self.step = step

    def on_step_end(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class Tally(Callback):
    """Counts the steps it saw and keeps the lowest evaluation loss so far; logs both at every epoch end."""

    def __init__(self):
        super().__init__()
        self.steps_seen = 0
        self.lowest_loss = None

    def on_step_end(self, state):
        self.steps_seen += 1

    def on_epoch_end(self, state):
        loss = state.evaluation.get("eval/loss")
        if loss is not None and (self.lowest_loss is None or loss < self.lowest_loss):
            self.lowest_loss = loss
        self.log("custom/steps_seen", self.steps_seen)
        if self.lowest_loss is not None:  # no evaluation yet (trainer.eval_interval=0 evaluates at the end only)
            self.log("custom/lowest_loss", self.lowest_loss)

    def state_dict(self):
        return {"steps_seen": self.steps_seen, "lowest_loss": self.lowest_loss}

    def load_state_dict(self, state):
        self.steps_seen = state["steps_seen"]
        self.lowest_loss = state["lowest_loss"]


class KeepsAnObject(Callback):
    """A state that is not JSON data: refused in one line before anything compiles."""

    def state_dict(self):
        return {"seen": {1, 2}}

    def load_state_dict(self, state):
        pass
