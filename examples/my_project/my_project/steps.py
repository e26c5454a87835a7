"""The project's training step: a TrainingWrapper subclass that overrides one phase."""
from trainkit import TrainingWrapper


class ClampedGradients(TrainingWrapper):
    """Clamps every gradient element to [-0.5, 0.5] before the built-in clipping and the optimizer.

    `transform_grads` runs once per optimizer update, on the accumulated and unscaled gradients; the
    rest of the step (loss scaling, accumulation, EMA, the non-finite guard) is the base class's.
    """

    clamp = 0.5

    def transform_grads(self, grads):
        grads = self.hyper_map(lambda g: g.clip(-self.clamp, self.clamp), grads)
        return super().transform_grads(grads)
