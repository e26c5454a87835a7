"""The run's step arithmetic, computed once: how many micro-batches, updates, epochs and sinks a run has.

``train(cfg)`` builds a :class:`StepPlan` from the config and the data as soon as the training set's size is known;
everything that counts steps (the accumulation check, the resume's end-of-run check, the callbacks' epochs, the
final metrics) reads it instead of multiplying ``trainer.epochs`` by ``steps_per_epoch`` again.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    """Resolved, checked counts of one run.

    Attributes:
        epochs: ``trainer.epochs``.
        steps_per_epoch: micro-batches per epoch on one rank (the training set's batches).
        accumulation_steps: micro-batches per optimizer update (``wrapper.accumulation_steps``).
        sink_size: micro-batches per sink (``trainer.sink_size`` as applied); 0 or less: no sinking.
        samples_per_step: samples in one micro-batch over every rank (``data.batch_size`` x ranks).
    """

    epochs: int
    steps_per_epoch: int
    accumulation_steps: int = 1
    sink_size: int = -1
    samples_per_step: int = 1

    @property
    def micro_steps(self) -> int:
        """Micro-batches in the whole run."""
        return self.epochs * self.steps_per_epoch

    @property
    def updates(self) -> int:
        """Optimizer updates in the whole run (a last incomplete window applies none)."""
        return self.micro_steps // self.accumulation_steps

    @property
    def sinks_per_epoch(self) -> int:
        """``Model.train``'s "epochs" per real epoch: with a sink size it counts each sink as one."""
        return self.steps_per_epoch // self.sink_size if self.sink_size > 0 else 1

    @property
    def model_epochs(self) -> int:
        """The epoch count ``Model.train`` is given."""
        return self.epochs * self.sinks_per_epoch
