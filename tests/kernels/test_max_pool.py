"""trainkit's C++ max pooling and its gradient (trainkit/kernels/fused.cc): bitwise NumPy's window maxima and
NumPy's adds of each upstream value at its window's first maximum, in graph and pynative mode, in both layouts."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from trainkit import kernels
from trainkit.kernels import geometry_values

pytestmark = pytest.mark.skipif(kernels.library()[0] is None, reason="trainkit's kernels do not build here")

GEOMETRIES = [  # N, C, H, W, (kh, kw, sh, sw, ph, pw, dh, dw)
    (2, 3, 9, 9, (3, 3, 2, 2, 1, 1, 1, 1)),   # ResNet's max pooling (odd size: the last window half padding)
    (2, 2, 8, 7, (2, 2, 2, 2, 0, 0, 1, 1)),
    (1, 3, 5, 6, (3, 2, 1, 2, 1, 1, 1, 1)),   # every parameter different in the two directions
    (2, 2, 9, 9, (3, 3, 1, 1, 2, 2, 2, 2)),   # dilated
    (40, 70, 16, 16, (3, 3, 2, 2, 1, 1, 1, 1)),  # large enough for several threads
]


def _windows(x: np.ndarray, geometry):
    """Yield (oh, ow, the window's values (N*C, kh*kw) with -inf padding, their (ih, iw) in the padded plane)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf).reshape(n * c, h + 2 * ph,
                                                                                              w + 2 * pw)
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    for oh in range(out_h):
        for ow in range(out_w):
            rows = oh * sh + dh * np.arange(kh)
            cols = ow * sw + dw * np.arange(kw)
            ih, iw = np.meshgrid(rows, cols, indexing="ij")
            yield oh, ow, padded[:, ih.ravel(), iw.ravel()], ih.ravel(), iw.ravel()


def numpy_max_pool(x: np.ndarray, geometry):
    """(the pooled values (N, C, OH, OW), the gradient of sum(pooled * upstream) w.r.t. x for a given upstream)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    n, c, h, w = x.shape
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    pooled = np.empty((n * c, out_h, out_w), np.float32)
    for oh, ow, values, _, _ in _windows(x, geometry):
        pooled[:, oh, ow] = values.max(axis=1)

    def gradient(upstream: np.ndarray) -> np.ndarray:
        up = upstream.reshape(n * c, out_h, out_w)
        dx = np.zeros((n * c, h + 2 * ph, w + 2 * pw), np.float32)
        planes = np.arange(n * c)
        for oh, ow, values, ih, iw in _windows(x, geometry):  # windows in row-major order, as float32 adds
            first = values.argmax(axis=1)  # the first maximum
            dx[planes, ih[first], iw[first]] += up[:, oh, ow]
        return dx[:, ph:ph + h, pw:pw + w].reshape(n, c, h, w)

    return pooled.reshape(n, c, out_h, out_w), gradient


class PooledLoss(nn.Cell):
    def __init__(self, geometry, upstream):
        super().__init__()
        self.pool = kernels.max_pool_kernel(geometry)
        self.geometry = Tensor(np.array(geometry_values(geometry), np.int64))
        self.upstream = Tensor(upstream)

    def construct(self, x):
        return (self.pool(x, self.geometry)[0] * self.upstream).sum()

    def pooled(self, x):
        return self.pool(x, self.geometry)[0]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
@pytest.mark.parametrize("channel_major", [False, True], ids=["nchw", "cnhw"])
@pytest.mark.parametrize("n, c, h, w, geometry", GEOMETRIES)
def test_max_pooling_and_its_gradient_are_numpys_bit_for_bit(mode, channel_major, n, c, h, w, geometry):
    """Half the input is 0 (a ReLU's output): ties, where the first maximum takes the gradient (as torch's).

    Mutations caught: `>=` for `>` in row_argmax (the last tie takes the gradient), the padding read as 0 instead
    of skipped (a window of negatives pools to 0), and PoolWindows letting a column of padding into the windows
    all fail here."""
    ms.set_context(mode=mode)
    rng = np.random.default_rng(sum(geometry) + n)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    x[:, :, ::2] = np.maximum(x[:, :, ::2], 0)
    x[:1, :1] = -np.abs(x[:1, :1]) - 1  # a plane of negatives only: the padding must not win
    expected, gradient = numpy_max_pool(x, geometry)
    upstream = rng.standard_normal(expected.shape).astype(np.float32)
    expected_gradient = gradient(upstream)
    layout = (1, 0, 2, 3) if channel_major else (0, 1, 2, 3)
    loss = PooledLoss(geometry, np.ascontiguousarray(upstream.transpose(layout)))
    given = Tensor(np.ascontiguousarray(x.transpose(layout)))
    np.testing.assert_array_equal(loss.pooled(given).asnumpy(), expected.transpose(layout))
    np.testing.assert_array_equal(ops.grad(loss)(given).asnumpy(), expected_gradient.transpose(layout))


def test_a_nan_in_a_window_pools_to_nan_as_in_torch(graph_mode):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan
    pooled = PooledLoss((2, 2, 2, 2, 0, 0, 1, 1), np.zeros((1, 1, 2, 2), np.float32)).pooled(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(pooled, [[[[np.nan, 7], [13, 15]]]])
