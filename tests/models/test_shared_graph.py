"""Layers built alike compile to one graph (trainkit.models.shared_graph), and each instance still computes with its
own Parameters, its own training mode and, for a subclass, its own attributes: every output against NumPy."""
import numpy as np
from mindspore import Tensor, nn

from tests.common.kernels import needs_compiler
from tests.models.test_conv import np_conv_and_grads
from trainkit.models.conv import ChannelMajorBatchNorm2d, UnfoldConv2d

pytestmark = needs_compiler
RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4, 5, 5)).astype(np.float32) * 2 + 1  # (C, N, H, W) for the channel-major cells


class Pair(nn.Cell):
    def __init__(self, first, second, third):
        super().__init__()
        self.first, self.second, self.third = first, second, third

    def construct(self, x):
        return self.first(x), self.second(x), self.third(x)


def numpy_batch_norm(x_cnhw, mean, variance, gamma, beta, eps=1e-5):
    shape = (-1, 1, 1, 1)
    return (x_cnhw - mean.reshape(shape)) / np.sqrt(variance.reshape(shape) + eps) * gamma.reshape(shape) \
        + beta.reshape(shape)


def test_a_batch_norm_in_eval_mode_does_not_take_the_train_mode_graph_of_one_built_alike(graph_mode):
    """MindSpore's key alone (class and arguments) gave the eval-mode one the batch's statistics."""
    cells = [ChannelMajorBatchNorm2d(3) for _ in range(3)]
    for cell, mean in zip(cells, (0.5, -1.0, 2.0)):
        cell.moving_mean.set_data(Tensor(np.full(3, mean, np.float32)))
        cell.moving_variance.set_data(Tensor(np.array([1.0, 4.0, 0.25], np.float32)))
    net = Pair(*cells)
    net.set_train(True)
    cells[1].set_train(False)
    first, second, third = (out.asnumpy() for out in net(Tensor(X)))
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    batch_mean, batch_variance = X.mean(axis=(1, 2, 3)), X.var(axis=(1, 2, 3))
    np.testing.assert_allclose(first, numpy_batch_norm(X, batch_mean, batch_variance, ones, zeros), atol=1e-5)
    np.testing.assert_allclose(third, numpy_batch_norm(X, batch_mean, batch_variance, ones, zeros), atol=1e-5)
    np.testing.assert_allclose(second, numpy_batch_norm(X, np.full(3, -1.0), np.array([1.0, 4.0, 0.25]), ones,
                                                        zeros), atol=1e-5)
    assert cells[0].cell_init_args == cells[2].cell_init_args != cells[1].cell_init_args


def test_convolutions_built_alike_each_use_their_own_weights(graph_mode):
    convs = [UnfoldConv2d(3, 2, 3, pad_mode="pad", padding=1, channel_major=True) for _ in range(3)]
    weights = [RNG.standard_normal((2, 3, 3, 3)).astype(np.float32) for _ in convs]
    for conv, weight in zip(convs, weights):
        conv.weight.set_data(Tensor(weight))
    outputs = Pair(*convs)(Tensor(X))
    nchw = X.transpose(1, 0, 2, 3)
    for out, weight in zip(outputs, weights):
        expected, *_ = np_conv_and_grads(nchw, weight, None, np.zeros((4, 2, 5, 5)), 1, 1, 1, 1)
        np.testing.assert_allclose(out.asnumpy().transpose(1, 0, 2, 3), expected, rtol=1e-5, atol=1e-5)
    assert convs[0].cell_init_args == convs[1].cell_init_args


class Shifted(ChannelMajorBatchNorm2d):
    """A user's subclass whose graph depends on an attribute no constructor argument shows."""

    def construct(self, x):
        return ChannelMajorBatchNorm2d.construct(self, x) + self.shift


def test_a_subclass_instance_gets_a_graph_of_its_own(graph_mode):
    cells = [Shifted(3) for _ in range(3)]
    for cell, shift in zip(cells, (1.0, 2.0, 3.0)):
        cell.shift = shift
    net = Pair(*cells)
    net.set_train(False)
    base = numpy_batch_norm(X, np.zeros(3), np.ones(3), np.ones(3), np.zeros(3))
    for out, shift in zip(net(Tensor(X)), (1.0, 2.0, 3.0)):
        np.testing.assert_allclose(out.asnumpy(), base + shift, atol=1e-5)
