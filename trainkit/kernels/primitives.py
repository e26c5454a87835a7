"""trainkit's fused kernels as MindSpore primitives (``ops.Custom(func_type="aot")``), or None where they do not build.

MindSpore 2.10's CPU kernels that write into a Parameter run at about a fifth of PyTorch's in-place foreach
(docs/performance.md, row 10): the EMA's ``assign_sub(e, (e - w) * c)`` is three kernels and three passes over
memory. An AOT kernel receives the Parameter's own memory and may write it in place (measured: the write is
visible to the graph, to ``asnumpy`` and to checkpoints), so the update is one multithreaded pass. The EMA kernel
is built with ``-ffp-contract=off``, so it rounds as MindSpore's three kernels do: both paths agree bit for bit.
The im2col kernels are out of place: they write the convolution's columns in the layout its MatMul takes.
"""
from __future__ import annotations

import functools
from typing import List, Sequence

from trainkit.kernels.build import library


def ema_update_kernel():
    """``ops.Custom`` updating an EMA shadow in place (inputs: shadow, value, weight), or None (see :func:`library`)."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitEmaUpdate")


def add_into_kernel():
    """``ops.Custom`` adding its second input into its first in place (inputs: buffer, value), or None."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitAddInto")


def ema_update_all_kernel():
    """``ops.Custom`` updating k float32 EMA shadows in place in one call (inputs: the k shadows, the k values,
    the weight), or None. One call for a network's tensors costs less than one per tensor (launches, threads)."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitEmaUpdateAll")


def add_into_all_kernel():
    """``ops.Custom`` adding k float32 values into k buffers in place in one call (inputs: the k buffers, then
    the k values), or None."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitAddIntoAll")


def accumulate_all_kernel():
    """``ops.Custom`` keeping an accumulation window's sum in k float32 buffers in one call (inputs: the k buffers,
    the k values, a bool `first`): assigned where `first` is True, added to after; or None. No branch in the graph
    for the window's first micro-step. Its output (float32 [1]) is the global L2 norm of the buffers as written,
    summed as :func:`norm_all_kernel` sums (the same bits), in the same pass over memory."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitAccumulateAll")


def norm_all_kernel():
    """``ops.Custom`` returning the global L2 norm of its k float32 inputs (float32 [1]), or None: one node and one
    pass over memory instead of a square and two reductions per tensor. The squares are summed in double, in fixed
    blocks of the values one after another (``fused.cc``'s ``blocked_norm``): the same bits whatever the thread
    count, and not infinite unless a value is or the norm itself exceeds float32."""
    path, _ = library()
    return None if path is None else _norm_all(path)


@functools.lru_cache(maxsize=None)
def _norm_all(path: str):
    from mindspore import dtype as mstype
    from mindspore import ops

    return ops.Custom(f"{path}:TrainkitNormAll", out_shape=lambda *shapes: [1],
                      out_dtype=lambda *dtypes: mstype.float32, func_type="aot")


def ema_update_all_if_kernel():
    """``ops.Custom`` as :func:`ema_update_all_kernel` with a last bool input: updates only when it is True (a
    skipped window leaves the shadows alone with no branch in the graph), or None."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitEmaUpdateAllIf")


def restore_all_unless_kernel():
    """``ops.Custom`` writing k float32 saved values back into k Parameters in one call unless its last (bool)
    input is True (inputs: the k Parameters, the k saved values, the flag), or None."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitRestoreAllUnless")


def restore_flat_unless_kernel():
    """``ops.Custom`` as :func:`restore_all_unless_kernel` with the saved values in one flat tensor, as
    :func:`concat_all_kernel` wrote them (inputs: the k Parameters, the flat saved values, the flag), or None."""
    path, _ = library()
    return None if path is None else _in_place_kernel(path, "TrainkitRestoreFlatUnless")


def concat_all_kernel():
    """``ops.Custom`` returning the values of its k float32 inputs one after another (float32, one axis): what
    ``ops.concat`` of their ``reshape((-1,))`` returns, bit for bit, as one node in the graph instead of 2k + 1
    (a ResNet-50's train graph compiles faster with fewer nodes), or None."""
    path, _ = library()
    return None if path is None else _concat_all(path)


@functools.lru_cache(maxsize=None)
def _concat_all(path: str):
    from mindspore import dtype as mstype
    from mindspore import ops

    def total(*shapes):
        size = 0
        for shape in shapes:
            count = 1
            for extent in shape:
                count *= int(extent)
            size += count
        return [size]

    return ops.Custom(f"{path}:TrainkitConcatAll", out_shape=total, out_dtype=lambda *dtypes: mstype.float32,
                      func_type="aot")


#: The fused optimizer updates by entry point: SGD with momentum, Adam, AdamWeightDecay.
OPTIMIZER_ENTRY_POINTS = ("TrainkitMomentumAll", "TrainkitAdamAll",
                          "TrainkitAdamWeightDecayAll")


def optimizer_update_kernel(entry_point: str):
    """``ops.Custom`` taking one optimizer step over k float32 tensors in place in one call, or None.

    `entry_point` is one of :data:`OPTIMIZER_ENTRY_POINTS`; its inputs are listed above it in ``fused.cc``. Each
    takes the gradient factor (unscale x clip) and a finite flag: on a non-finite step nothing it writes moves
    (weights, moments, beta powers, the step counter).
    """
    if entry_point not in OPTIMIZER_ENTRY_POINTS:
        raise ValueError(f"entry_point must be one of {', '.join(OPTIMIZER_ENTRY_POINTS)}; got {entry_point!r}")
    path, _ = library()
    return None if path is None else _in_place_kernel(path, entry_point)


@functools.lru_cache(maxsize=None)
def _in_place_kernel(path: str, entry_point: str):
    """The library's `entry_point` as a primitive that writes its first input(s) (its output is a dummy flag)."""
    from mindspore import dtype as mstype
    from mindspore import ops

    kernel = ops.Custom(f"{path}:{entry_point}", out_shape=lambda *shapes: [1],
                        out_dtype=lambda *dtypes: mstype.float32, func_type="aot")
    # It writes its first input: a memory side effect, which MindSpore's graph keeps and orders like an Assign's
    # (without the mark, a graph that does not use the kernel's output drops the kernel).
    kernel.add_prim_attr("side_effect_mem", True)
    return kernel


def im2col_kernel(geometry: Sequence[int], channel_major: bool = False):
    """``ops.Custom`` writing a convolution's columns, or None (see :func:`~trainkit.kernels.build.library`).

    Inputs: x (float32 (N, C, H, W), or (C, N, H, W) with `channel_major`) and the int64 tensor
    :func:`geometry_values` gives; output: (C * kh * kw, N * OH * OW), row (c, i, j) channel-major then kernel
    offset, as ``ops.unfold`` then a transpose. Its gradient is the C++ col2im, so a training step runs no
    MindSpore Im2Col or Col2Im.
    """
    path, _ = library()
    return None if path is None else _im2col(path, tuple(int(value) for value in geometry), bool(channel_major))


def gelu_kernel():
    """``ops.Custom`` computing the exact GELU (``0.5 x (1 + erf(x / sqrt 2))``) of a float32 tensor, its gradient
    a second kernel, or None (see :func:`~trainkit.kernels.build.library`)."""
    path, _ = library()
    return None if path is None else _gelu(path)


@functools.lru_cache(maxsize=None)
def _gelu(path: str):
    from mindspore import ops

    gradient = ops.Custom(f"{path}:TrainkitGeluGrad", out_shape=lambda dy, _x: dy, out_dtype=lambda dy, _x: dy,
                          func_type="aot")

    def bprop(x, _out, dy):
        return (gradient(dy, x),)

    return ops.Custom(f"{path}:TrainkitGelu", out_shape=lambda x: x, out_dtype=lambda x: x, func_type="aot",
                      bprop=bprop)


def depthwise_kernel(geometry: Sequence[int], channel_major: bool = False):
    """``ops.Custom`` computing a depthwise convolution (groups = in = out channels) directly, or None.

    Inputs: x (float32 (N, C, H, W), or (C, N, H, W) with `channel_major`), the weight (float32 (C, 1, kh, kw))
    and the int64 tensor :func:`geometry_values` gives; output: (N, C, OH, OW) in x's layout, no bias. Its
    gradients are two more kernels (by the input, by the weight), so a step writes no columns at all.
    """
    path, _ = library()
    return None if path is None else _depthwise(path, tuple(int(value) for value in geometry), bool(channel_major))


@functools.lru_cache(maxsize=None)
def _depthwise(path: str, geometry: tuple, channel_major: bool):
    from mindspore import ops

    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    attribute = geometry_values(geometry, channel_major)

    def output_shape(x_shape, _weight_shape, _geometry_shape):
        out_h, out_w = conv_output_size(x_shape[2], kh, sh, ph, dh), conv_output_size(x_shape[3], kw, sw, pw, dw)
        return [x_shape[0], x_shape[1], out_h, out_w]

    by_input = ops.Custom(f"{path}:TrainkitDepthwiseGradInput", out_shape=lambda _dy, _w, x_shape, _g: x_shape,
                          out_dtype=lambda dy, _w, _x, _g: dy, func_type="aot")
    by_weight = ops.Custom(f"{path}:TrainkitDepthwiseGradWeight", out_shape=lambda _dy, _x, w_shape, _g: w_shape,
                           out_dtype=lambda dy, _x, _w, _g: dy, func_type="aot")
    for kernel in (by_input, by_weight):
        kernel.add_prim_attr("geometry", attribute)

    def bprop(x, weight, geometry_tensor, _out, dy):
        return (by_input(dy, weight, x, geometry_tensor), by_weight(dy, x, weight, geometry_tensor),
                ops.zeros_like(geometry_tensor))

    forward = ops.Custom(f"{path}:TrainkitDepthwise", out_shape=output_shape, out_dtype=lambda x, _w, _g: x,
                         func_type="aot", bprop=bprop)
    forward.add_prim_attr("geometry", attribute)  # pynative caches inferred shapes by attributes (see _im2col)
    return forward


def max_pool_kernel(geometry: Sequence[int]):
    """``ops.Custom`` computing max pooling and where each output came from, or None.

    `geometry`: kh, kw, sh, sw, ph, pw, dh, dw and 1 for ``ceil_mode`` (else 0). Inputs: x (float32 (N, C, H, W))
    and the int64 tensor of `geometry`; outputs: y (float32 (N, C, OH, OW), OH and OW as PyTorch's max_pool2d
    computes them) and the int32 index in its input plane of the value each output took. Its gradient is a second
    kernel adding each output's gradient at that index.
    """
    path, _ = library()
    return None if path is None else _max_pool(path, tuple(int(value) for value in geometry))


@functools.lru_cache(maxsize=None)
def _max_pool(path: str, geometry: tuple):
    from mindspore import dtype as mstype
    from mindspore import ops

    kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode = geometry
    gradient = ops.Custom(f"{path}:TrainkitMaxPoolGrad", out_shape=lambda _dy, _where, x_shape: x_shape,
                          out_dtype=lambda dy, _where, _x: dy, func_type="aot")
    gradient.add_prim_attr("geometry", list(geometry))

    def bprop(x, geometry_tensor, out, dout):
        return gradient(dout[0], out[1], x), ops.zeros_like(geometry_tensor)

    def shapes(x_shape, _geometry_shape):
        shape = [x_shape[0], x_shape[1], pool_output_size(x_shape[2], kh, sh, ph, dh, ceil_mode),
                 pool_output_size(x_shape[3], kw, sw, pw, dw, ceil_mode)]
        return [shape, shape]

    pool = ops.Custom(f"{path}:TrainkitMaxPool", out_shape=shapes, out_dtype=lambda x, _g: [x, mstype.int32],
                      func_type="aot", bprop=bprop)
    pool.add_prim_attr("geometry", list(geometry))  # pynative caches inferred shapes by attributes (see _im2col)
    return pool


def layer_norm_kernel():
    """``ops.Custom`` computing the layer norm over the last axis, or None.

    Inputs: x (float32, last axis d), gamma and beta (float32 [d]), epsilon (float32 [1]); outputs: y (x's shape),
    and each row's mean and 1 / sqrt(var + epsilon) (float32 [rows]) for the gradient, a second kernel giving the
    gradients of x, gamma and beta.
    """
    path, _ = library()
    return None if path is None else _layer_norm(path)


@functools.lru_cache(maxsize=None)
def _layer_norm(path: str):
    from mindspore import ops

    def rows(x_shape, gamma_shape):
        count = 1
        for extent in x_shape:
            count *= int(extent)
        return [count // max(1, int(gamma_shape[0]))]

    gradient = ops.Custom(f"{path}:TrainkitLayerNormGrad",
                          out_shape=lambda _dy, x, gamma, _mean, _rstd: [x, gamma, gamma],
                          out_dtype=lambda dy, _x, _g, _m, _r: [dy, dy, dy], func_type="aot")

    def bprop(x, gamma, beta, epsilon, out, dout):
        dx, dgamma, dbeta = gradient(dout[0], x, gamma, out[1], out[2])
        return dx, dgamma, dbeta, ops.zeros_like(epsilon)

    return ops.Custom(f"{path}:TrainkitLayerNorm",
                      out_shape=lambda x, gamma, _beta, _eps: [x, rows(x, gamma), rows(x, gamma)],
                      out_dtype=lambda x, _g, _b, _e: [x, x, x], func_type="aot", bprop=bprop)


def batch_norm_kernel():
    """``ops.Custom`` computing batch norm in training over (N, C, H, W) and updating the moving statistics in
    place, or None.

    Inputs: x (float32), gamma, beta, moving_mean, moving_variance (float32 [C]; the last two written) and
    [epsilon, momentum] (float32 [2]); outputs: y (x's shape), and each channel's mean and 1 / sqrt(var + epsilon)
    for the gradient, a second kernel giving the gradients of x, gamma and beta.
    """
    path, _ = library()
    return None if path is None else _batch_norm(path)


@functools.lru_cache(maxsize=None)
def _batch_norm(path: str):
    from mindspore import ops

    gradient = ops.Custom(f"{path}:TrainkitBatchNormGrad",
                          out_shape=lambda _dy, x, gamma, _mean, _rstd: [x, gamma, gamma],
                          out_dtype=lambda dy, _x, _g, _m, _r: [dy, dy, dy], func_type="aot")

    def bprop(x, gamma, beta, moving_mean, moving_variance, settings, out, dout):
        dx, dgamma, dbeta = gradient(dout[0], x, gamma, out[1], out[2])
        return (dx, dgamma, dbeta, ops.zeros_like(moving_mean), ops.zeros_like(moving_variance),
                ops.zeros_like(settings))

    kernel = ops.Custom(f"{path}:TrainkitBatchNorm",
                        out_shape=lambda x, gamma, _b, _mm, _mv, _s: [x, gamma, gamma],
                        out_dtype=lambda x, _g, _b, _mm, _mv, _s: [x, x, x], func_type="aot", bprop=bprop)
    kernel.add_prim_attr("side_effect_mem", True)  # it writes the moving statistics (see _in_place_kernel)
    return kernel


def pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """A pooling's output length along one axis, as PyTorch computes it (with ``ceil_mode``, a last window must
    start inside the input or its left padding)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """A convolution's output length along one axis (symmetric `padding`), as torch and the kernels compute it."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def geometry_values(geometry: Sequence[int], channel_major: bool = False) -> List[int]:
    """The kernels' geometry input: kh, kw, sh, sw, ph, pw, dh, dw and 1 for a (C, N, H, W) input, else 0."""
    return [int(value) for value in geometry] + [int(bool(channel_major))]


@functools.lru_cache(maxsize=None)
def _im2col(path: str, geometry: tuple, channel_major: bool):
    from mindspore import ops

    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    attribute = geometry_values(geometry, channel_major)

    def columns_shape(x_shape, _geometry_shape):
        n, c = (x_shape[1], x_shape[0]) if channel_major else (x_shape[0], x_shape[1])
        out_h, out_w = conv_output_size(x_shape[2], kh, sh, ph, dh), conv_output_size(x_shape[3], kw, sw, pw, dw)
        return [c * kh * kw, n * out_h * out_w]

    col2im = ops.Custom(f"{path}:TrainkitCol2Im", out_shape=lambda _d_cols, x_shape, _g: x_shape,
                        out_dtype=lambda d_cols, _x, _g: d_cols, func_type="aot")
    col2im.add_prim_attr("geometry", attribute)

    def bprop(x, geometry_tensor, _out, d_cols):
        return col2im(d_cols, x, geometry_tensor), ops.zeros_like(geometry_tensor)

    im2col = ops.Custom(f"{path}:TrainkitIm2Col", out_shape=columns_shape, out_dtype=lambda x, _g: x,
                        func_type="aot", bprop=bprop)
    # Pynative mode caches a primitive's inferred shape by its attributes and input shapes: without the geometry
    # among the attributes, a stride-2 kernel took the columns' shape inferred for a stride-1 one.
    im2col.add_prim_attr("geometry", attribute)
    return im2col
