"""A depthwise convolution (groups = in = out channels) runs as trainkit's direct kernel: forward and both gradients
against the convolution written here in NumPy (tests/models/test_conv.py's), over drawn geometries and both
layouts, in graph and pynative mode."""
import random

import numpy as np
import pytest
from mindspore import Tensor

from tests.models.test_conv import _ForwardAndGrads, np_conv_and_grads
from trainkit import kernels
from trainkit.models.conv import UnfoldConv2d

pytestmark = pytest.mark.skipif(kernels.library()[0] is None, reason="trainkit's C++ kernels do not build here")


def drawn_geometry(seed):
    """A geometry with at least one output (drawn again until it has one)."""
    rng = random.Random(seed)
    while True:
        kernel = rng.choice([2, 3, 5, 7])
        g = {"channels": rng.choice([2, 3, 8, 13]), "n": rng.choice([1, 2, 3]), "size": rng.choice([1, 4, 7, 9, 16]),
             "kernel": kernel, "stride": rng.choice([1, 1, 2, 3]), "padding": rng.choice([0, 1, kernel // 2, kernel]),
             "dilation": rng.choice([1, 1, 2]), "bias": rng.random() < 0.5, "channel_major": rng.random() < 0.3}
        if g["size"] + 2 * g["padding"] - g["dilation"] * (kernel - 1) - 1 >= 0:
            return g


@pytest.mark.parametrize("seed", range(40))
def test_the_direct_depthwise_kernel_is_numpys_convolution_and_gradients(mode, seed):
    g = drawn_geometry(seed)
    c, size, k, s, p, d = g["channels"], g["size"], g["kernel"], g["stride"], g["padding"], g["dilation"]
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    rng = np.random.default_rng(seed)
    conv = UnfoldConv2d(c, c, k, stride=s, pad_mode="pad", padding=p, dilation=d, group=c, has_bias=g["bias"],
                        weight_init="normal", bias_init="normal" if g["bias"] else None,
                        channel_major=g["channel_major"])
    assert conv.depthwise is not None and conv.im2col is None
    x = rng.standard_normal((g["n"], c, size, size)).astype(np.float32)
    upstream = rng.standard_normal((g["n"], c, out, out)).astype(np.float32)
    w = conv.weight.asnumpy().astype(np.float64)
    b = conv.bias.asnumpy().astype(np.float64) if g["bias"] else None
    expected = [e for e in np_conv_and_grads(x.astype(np.float64), w, b, upstream, s, p, d, c) if e is not None]
    if g["channel_major"]:  # (C, N, H, W) in and out, compared as (N, C, H, W)
        y, ((dx,), grads) = _ForwardAndGrads(conv, Tensor(upstream.transpose(1, 0, 2, 3).copy()))(
            Tensor(x.transpose(1, 0, 2, 3).copy()))
        got = [y.asnumpy().transpose(1, 0, 2, 3), dx.asnumpy().transpose(1, 0, 2, 3)]
    else:
        y, ((dx,), grads) = _ForwardAndGrads(conv, Tensor(upstream))(Tensor(x))
        got = [y.asnumpy(), dx.asnumpy()]
    got += [grad.asnumpy() for grad in grads]
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5)


def test_a_convolution_with_a_channel_multiplier_keeps_the_columns():
    conv = UnfoldConv2d(4, 8, 3, pad_mode="pad", padding=1, group=4)
    assert conv.depthwise is None and conv.im2col is not None
