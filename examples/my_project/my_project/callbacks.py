"""WeightNorm: a callback that records a value of its own, beside trainkit's, in metrics.jsonl and TensorBoard."""
import math

from trainkit import Callback


class WeightNorm(Callback):
    """The L2 norm of the trainable weights after each epoch, and the learning rate every `every` steps."""

    def __init__(self, every: int = 10):
        super().__init__()
        self.every = every

    def on_step_end(self, state):
        if state.step % self.every == 0:
            self.log("custom/learning_rate", state.learning_rate)

    def on_epoch_end(self, state):
        squares = sum(float((p.asnumpy().astype("float64") ** 2).sum()) for p in state.network.trainable_params())
        self.log("custom/weight_norm", math.sqrt(squares))
