"""trainkit's C++ im2col and its gradient (trainkit/kernels/fused.cc): bitwise NumPy's columns and NumPy's
scatter-add in the same order, in graph and pynative mode, for every geometry UnfoldConv2d passes it."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from trainkit import kernels
from trainkit.kernels import geometry_values

pytestmark = pytest.mark.skipif(kernels.library()[0] is None, reason="trainkit's kernels do not build here")

GEOMETRIES = [  # N, C, H, W, (kh, kw, sh, sw, ph, pw, dh, dw)
    (2, 3, 7, 7, (3, 3, 1, 1, 1, 1, 1, 1)),
    (3, 2, 9, 6, (3, 2, 2, 1, 1, 0, 2, 1)),   # every parameter different in the two directions
    (2, 4, 8, 8, (7, 7, 2, 2, 3, 3, 1, 1)),   # ResNet's stem
    (1, 5, 1, 1, (3, 3, 1, 1, 1, 1, 1, 1)),   # ResNet-50's layer 4 at 32x32: one pixel, the rest padding
    (600, 70, 3, 3, (3, 3, 1, 1, 1, 1, 1, 1)),  # large enough for several threads
]


def numpy_columns(x: np.ndarray, geometry) -> np.ndarray:
    """(C*kh*kw, N*OH*OW): row (c, i, j) holds x at (oh*sh - ph + i*dh, ow*sw - pw + j*dw), zero outside."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    n, c, h, w = x.shape
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((c, kh, kw, n, out_h, out_w), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = padded[:, :, i * dh:i * dh + (out_h - 1) * sh + 1:sh,
                                   j * dw:j * dw + (out_w - 1) * sw + 1:sw].transpose(1, 0, 2, 3)
    return cols.reshape(c * kh * kw, n * out_h * out_w)


def numpy_columns_gradient(upstream: np.ndarray, x_shape, geometry) -> np.ndarray:
    """The gradient of sum(columns * upstream) w.r.t. x: float32 adds per kernel offset, i then j."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    n, c, h, w = x_shape
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    up = upstream.reshape(c, kh, kw, n, out_h, out_w)
    padded = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32)
    for i in range(kh):
        for j in range(kw):
            padded[:, :, i * dh:i * dh + (out_h - 1) * sh + 1:sh,
                   j * dw:j * dw + (out_w - 1) * sw + 1:sw] += up[:, i, j].transpose(1, 0, 2, 3)
    return padded[:, :, ph:ph + h, pw:pw + w]


class ColumnsLoss(nn.Cell):
    def __init__(self, geometry, upstream, channel_major=False):
        super().__init__()
        self.im2col = kernels.im2col_kernel(geometry, channel_major)
        self.geometry = Tensor(np.array(geometry_values(geometry, channel_major), np.int64))
        self.upstream = Tensor(upstream)

    def construct(self, x):
        return (self.im2col(x, self.geometry) * self.upstream).sum()

    def columns(self, x):
        return self.im2col(x, self.geometry)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
@pytest.mark.parametrize("channel_major", [False, True], ids=["nchw", "cnhw"])
@pytest.mark.parametrize("n, c, h, w, geometry", GEOMETRIES)
def test_columns_and_their_gradient_are_numpys_bit_for_bit(mode, channel_major, n, c, h, w, geometry):
    """The same columns whether x comes as (N, C, H, W) or (C, N, H, W); the gradient in x's own layout.

    Mutations caught: im2col filling a row that reads only padding with 1 instead of 0 (the (1, 5, 1, 1) case), and
    col2im gathering an input value's reads in reverse kernel-offset order (another float32 sum)."""
    ms.set_context(mode=mode)
    rng = np.random.default_rng(sum(geometry) + n)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    expected = numpy_columns(x, geometry)
    expected_gradient = numpy_columns_gradient(upstream := rng.standard_normal(expected.shape).astype(np.float32),
                                               x.shape, geometry)
    given = np.ascontiguousarray(x.transpose(1, 0, 2, 3)) if channel_major else x
    loss = ColumnsLoss(geometry, upstream, channel_major)
    np.testing.assert_array_equal(loss.columns(Tensor(given)).asnumpy(), expected)
    gradient = ops.grad(loss)(Tensor(given)).asnumpy()
    np.testing.assert_array_equal(gradient, expected_gradient.transpose(1, 0, 2, 3) if channel_major
                                  else expected_gradient)


def test_the_columns_are_ops_unfolds_values_in_the_matmuls_layout():
    ms.set_context(mode=ms.GRAPH_MODE)
    x = np.random.default_rng(1).standard_normal((3, 4, 6, 5)).astype(np.float32)
    geometry = (3, 3, 2, 1, 1, 1, 1, 1)
    unfolded = ops.unfold(Tensor(x), (3, 3), (1, 1), (1, 1), (2, 1)).asnumpy()  # (N, C*9, L)
    ours = ColumnsLoss(geometry, np.zeros(1, np.float32)).columns(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(ours, unfolded.transpose(1, 0, 2).reshape(ours.shape))
