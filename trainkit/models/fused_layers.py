"""`model.layer_impl` for any network: its exact `nn.GELU`, `nn.MaxPool2d`, last-axis `nn.LayerNorm` and
`nn.BatchNorm2d` run by trainkit's C++ kernels.

MindSpore 2.10's CPU GeLU and its gradient ran at about a tenth of PyTorch's speed on ConvNeXt's activations, its
`nn.MaxPool2d` with padding (a 3-D max pool that also computes its argmax) took 7 % of a ported ResNet-18's step,
its LayerNormGrad a tenth of ConvNeXt's, and its BatchNorm and BatchNormGrad 16 % of a ported ResNet-50's at
224x224 (bench/family_speed.py). The app swaps them after the network is built, as `model.conv_impl`'s swap does:
a swapped norm holds the very same Parameters (`gamma`, `beta`, the moving statistics), so checkpoints,
fine-tuning and the optimizer see no difference, and exports rebuild the network with `layer_impl=native`. The
kernels compute PyTorch's functions: GELU within 4e-7 x max(1, |y|) of ``0.5 x (1 + erf(x / sqrt 2))``, max
pooling exactly (padding as -inf, the first largest value, NaN wins), the norms with their statistics summed in a
fixed order; batch norm updates its moving statistics as MindSpore's does (the variance unbiased), and evaluates
with MindSpore's own kernel.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from trainkit.kernels import batch_norm_kernel, gelu_kernel, layer_norm_kernel, library, max_pool_kernel
from trainkit.models.conv_swap import _replace_child

__all__ = ["LAYER_IMPLS", "FusedBatchNorm2d", "FusedGELU", "FusedLayerNorm", "FusedMaxPool2d", "kernel_layers",
           "resolve_layer_impl", "swap_layers"]

#: `model.layer_impl`'s values: `auto` is `fused` where trainkit's kernels build (on CPU), else `native`.
LAYER_IMPLS = ("auto", "native", "fused")


class FusedGELU(nn.Cell):
    """The exact GELU (``approximate=False``) as one kernel forward and one backward, float32."""

    def __init__(self):
        super().__init__()
        self.gelu = gelu_kernel()
        if self.gelu is None:
            raise ValueError(f"layer_impl=fused needs trainkit's C++ kernels, which cannot run here ({library()[1]}); "
                             "use layer_impl=auto")

    def construct(self, x):
        if x.dtype == ms.float32:
            return self.gelu(x)
        return self.gelu(x.astype(ms.float32)).astype(x.dtype)  # the kernel is float32 only


class FusedMaxPool2d(nn.Cell):
    """PyTorch's max_pool2d (NCHW, symmetric padding read as -inf, dilation, ceil_mode) as one kernel forward that
    keeps where each output came from, and one backward."""

    def __init__(self, kernel_size, stride, padding=(0, 0), dilation=(1, 1), ceil_mode: bool = False):
        super().__init__()
        geometry = [*_pair(kernel_size), *_pair(stride), *_pair(padding), *_pair(dilation), int(bool(ceil_mode))]
        self.pool = max_pool_kernel(geometry)
        if self.pool is None:
            raise ValueError(f"layer_impl=fused needs trainkit's C++ kernels, which cannot run here ({library()[1]}); "
                             "use layer_impl=auto")
        self.geometry = Tensor(np.array(geometry, np.int64))

    def construct(self, x):
        if x.dtype == ms.float32:
            return self.pool(x, self.geometry)[0]
        return self.pool(x.astype(ms.float32), self.geometry)[0].astype(x.dtype)


class FusedLayerNorm(nn.Cell):
    """A layer norm over the last axis as one kernel forward and one backward (float32), holding `layer`'s own
    `gamma` and `beta` Parameters (same names, same memory)."""

    def __init__(self, layer: nn.LayerNorm):
        super().__init__()
        self.norm = layer_norm_kernel()
        if self.norm is None:
            raise ValueError(f"layer_impl=fused needs trainkit's C++ kernels, which cannot run here ({library()[1]}); "
                             "use layer_impl=auto")
        # The Parameter objects themselves, as conv_swap keeps a convolution's: names, the optimizer's and the
        # checkpoints' view of them stay the same.
        self._params["gamma"] = layer.gamma  # noqa: SLF001
        self._params["beta"] = layer.beta  # noqa: SLF001
        self.epsilon = Tensor(np.array([layer.epsilon], np.float32))

    def construct(self, x):
        if x.dtype == ms.float32 and self.gamma.dtype == ms.float32:
            return self.norm(x, self.gamma, self.beta, self.epsilon)[0]
        return self.norm(x.astype(ms.float32), self.gamma.astype(ms.float32), self.beta.astype(ms.float32),
                         self.epsilon)[0].astype(x.dtype)


class FusedBatchNorm2d(nn.Cell):
    """Batch norm of (N, C, H, W) in training as one kernel forward (the moving statistics updated in place by it)
    and one backward, float32, holding `layer`'s own four Parameters; in evaluation, MindSpore's own kernel."""

    def __init__(self, layer: nn.BatchNorm2d):
        super().__init__()
        self.norm = batch_norm_kernel()
        if self.norm is None:
            raise ValueError(f"layer_impl=fused needs trainkit's C++ kernels, which cannot run here ({library()[1]}); "
                             "use layer_impl=auto")
        for name in ("moving_mean", "moving_variance", "gamma", "beta"):  # MindSpore's order: checkpoints alike
            self._params[name] = getattr(layer, name)  # noqa: SLF001 - the Parameter objects themselves
        # MindSpore keeps 1 - the constructor's momentum: the weight of the batch's statistics
        self.settings = Tensor(np.array([layer.eps, layer.momentum], np.float32))
        self.bn_infer = layer.bn_infer

    def construct(self, x):
        if not self.training:
            return self.bn_infer(x, self.gamma, self.beta, self.moving_mean, self.moving_variance)[0]
        if x.dtype == ms.float32:
            return self.norm(x, self.gamma, self.beta, self.moving_mean, self.moving_variance, self.settings)[0]
        return self.norm(x.astype(ms.float32), self.gamma, self.beta, self.moving_mean, self.moving_variance,
                         self.settings)[0].astype(x.dtype)  # the kernel is float32 only


def fused_batch_norm(layer: nn.BatchNorm2d) -> Optional[FusedBatchNorm2d]:
    """The `FusedBatchNorm2d` computing `layer`, or None where it cannot (NHWC, fixed batch statistics, float16)."""
    if layer.format != "NCHW" or layer.use_batch_statistics is not None or layer.gamma.dtype != ms.float32:
        return None
    return FusedBatchNorm2d(layer)


def last_axis_norm(layer: nn.LayerNorm) -> bool:
    """Whether `layer` normalises over the last axis only, with gamma and beta of that axis (the kernel's case)."""
    return (len(layer.normalized_shape) == 1 and layer.begin_norm_axis == -1 and layer.begin_params_axis == -1
            and tuple(layer.gamma.shape) == tuple(layer.normalized_shape))


def _pair(value):
    return (int(value), int(value)) if isinstance(value, int) else tuple(int(v) for v in value)


def fused_max_pool(pool: nn.MaxPool2d) -> Optional[FusedMaxPool2d]:
    """The `FusedMaxPool2d` computing `pool`, or None where it cannot (NHWC, ``same`` padding, indices returned)."""
    if pool.format != "NCHW" or getattr(pool, "return_indices", False):
        return None
    attributes = pool.max_pool.attrs
    if getattr(pool, "use_pad", False):  # MindSpore's 3-D max pool with argmax: (1, kh, kw) etc.
        return FusedMaxPool2d(attributes["ksize"][1:], attributes["strides"][1:], attributes["pads"][1:],
                              attributes["dilation"][1:], attributes["ceil_mode"])
    if str(attributes.get("pad_mode", "")).upper() != "VALID":
        return None
    return FusedMaxPool2d(attributes["kernel_size"][2:], attributes["strides"][2:])


def resolve_layer_impl(layer_impl: str) -> str:
    """`native` or `fused`: what `layer_impl` stands for here (`auto`: `fused` on CPU where the kernels build)."""
    if layer_impl not in LAYER_IMPLS:
        raise ValueError(f"layer_impl must be one of {', '.join(LAYER_IMPLS)}; got {layer_impl!r}")
    if layer_impl != "auto":
        return layer_impl
    return "fused" if ms.get_context("device_target") == "CPU" and library()[0] is not None else "native"


def swap_layers(network: nn.Cell, layer_impl: str = "auto") -> Dict[str, int]:
    """Replace each exact `nn.GELU`, `nn.MaxPool2d`, last-axis `nn.LayerNorm` and `nn.BatchNorm2d` of `network` by
    trainkit's fused layer where `layer_impl` resolves to `fused`, in place; how many of each were swapped. The
    tanh GELU, subclasses, and pools and norms the kernels do not compute are left as they are."""
    swapped = {"GELU": 0, "MaxPool2d": 0, "LayerNorm": 0, "BatchNorm2d": 0}
    if resolve_layer_impl(layer_impl) == "native":
        return swapped
    for _, parent in list(network.cells_and_names()):
        for key, child in list(parent._cells.items()):  # noqa: SLF001 - MindSpore keeps the children there
            replacement, kind = None, type(child).__name__
            if type(child) is nn.GELU and child.approximate == "none":  # pylint: disable=unidiomatic-typecheck
                replacement = FusedGELU()
            elif type(child) is nn.MaxPool2d:  # pylint: disable=unidiomatic-typecheck
                replacement = fused_max_pool(child)
            elif type(child) is nn.LayerNorm and last_axis_norm(child):  # pylint: disable=unidiomatic-typecheck
                replacement = FusedLayerNorm(child)
            elif type(child) is nn.BatchNorm2d:  # pylint: disable=unidiomatic-typecheck
                replacement = fused_batch_norm(child)
            if replacement is not None:
                replacement.set_train(child.training)
                _replace_child(parent, key, replacement)
                swapped[kind] += 1
    return swapped


def kernel_layers(network: nn.Cell) -> List[str]:
    """The names of `network`'s fused layers (float32 kernels: MindSpore must not hand them half-precision memory op
    by op, as :func:`trainkit.models.conv.kernel_convolutions` explains for the convolutions)."""
    return [name for name, cell in network.cells_and_names()
            if isinstance(cell, (FusedGELU, FusedMaxPool2d, FusedLayerNorm, FusedBatchNorm2d))]
