"""A TrainingWrapper subclass with an argument of its own and a scalar of its own in the records."""
from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype

from trainkit import TrainingWrapper

_add_noise = ops.MultitypeFuncGraph("add_noise")


@_add_noise.register("Number", "Tensor")
def _(std, grad):
    return grad + ops.standard_normal(grad.shape).astype(grad.dtype) * std


class NoisyWrapper(TrainingWrapper):
    """Adds Gaussian noise of `noise_std` to each window's gradients; counts the windows it noised."""

    def __init__(self, *args, noise_std: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise_std = float(noise_std)
        self.noisy_updates = Parameter(Tensor(0, mstype.int32), name="noisy_updates", requires_grad=False)

    def transform_grads(self, grads):
        if self.noise_std > 0:  # a Python flag: folded when the graph compiles
            grads = self.hyper_map(ops.partial(_add_noise, self.noise_std), grads)
        grads = ops.depend(grads, ops.assign_add(self.noisy_updates, ops.ones((), mstype.int32)))
        return super().transform_grads(grads)

    def logged_scalars(self):
        return {"noisy_updates": self.noisy_updates}
