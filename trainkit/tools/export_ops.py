"""``mindspore.ops`` as a module that defines a network's Cells sees it while :func:`trainkit.tools.deploy.
onnx_twins` writes an ONNX file: every name is ``mindspore.ops``' own, except the functions whose operators the
ONNX exporter lacks, which are compositions of operators it has (same signatures, same results).

A real module, not an object, holding every public name of ``mindspore.ops`` itself: MindSpore's graph compiler
resolves a global it meets by its module's name, then the attribute in that module's namespace.
"""
from mindspore import ops as _ops

from trainkit.tools import export_twins as _twins

globals().update({name: getattr(_ops, name) for name in dir(_ops) if not name.startswith("_")})


def _two(value):
    return (value, value) if isinstance(value, int) else (value[0], value[1])


def hardswish(x):
    """``mindspore.ops.hardswish`` (HSwish) as ``x * relu6(x + 3) / 6``."""
    return _twins.hard_swish(x)


def hardsigmoid(x):
    """``mindspore.ops.hardsigmoid`` (HSigmoid) as ``relu6(x + 3) / 6``."""
    return _twins.hard_sigmoid(x)


def gelu(x, approximate="none"):
    """``mindspore.ops.gelu``: the exact one (Erf) composed, the tanh one MindSpore's own (it exports)."""
    if approximate == "tanh":
        return _ops.gelu(x, approximate="tanh")
    return _twins.gelu_erf(x)


def clamp(input, min=None, max=None):  # noqa: A002 - mindspore.ops.clamp's own names
    """``mindspore.ops.clamp`` as Maximum and Minimum: the exporter stops on a clamp with one bound."""
    return _twins.clamp(input, min, max)


clip = clamp  # mindspore.ops.clip: the same function


def pad(input, pad, mode="constant", value=None):  # noqa: A002 - mindspore.ops.pad's own names
    """``mindspore.ops.pad`` (PadV3): the constant mode as concatenations; other modes MindSpore's own."""
    if mode != "constant":
        return _ops.pad(input, pad, mode=mode, value=value)
    return _twins.constant_pad(input, pad, 0.0 if value is None else value)


def unbind(input, dim=0):  # noqa: A002
    """``mindspore.ops.unbind`` (Unstack) as slices."""
    return _twins.unbind(input, dim)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, *, ceil_mode=False, return_indices=False):
    """``mindspore.ops.max_pool2d`` (MaxPoolWithArgmaxV2), dilation 1, without indices: -inf padding, MaxPool."""
    stride = kernel_size if stride is None else stride
    return _twins.max_pool_2d(x, _two(kernel_size), _two(stride), _two(padding), ceil_mode)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """``mindspore.ops.avg_pool2d`` (AvgPool3D): zero padding, AveragePool and PyTorch's divisor."""
    stride = kernel_size if stride is None else stride
    divisor = 0 if divisor_override is None else divisor_override
    return _twins.avg_pool_2d(x, _two(kernel_size), _two(stride), _two(padding), ceil_mode, count_include_pad,
                              divisor)


def adaptive_avg_pool2d(x, output_size):
    """``mindspore.ops.adaptive_avg_pool2d`` (AdaptiveAvgPool2D) as means over PyTorch's bins."""
    return _twins.adaptive_pool_2d(x, _two(output_size), False)


def adaptive_max_pool2d(x, output_size, return_indices=False):
    """``mindspore.ops.adaptive_max_pool2d`` (AdaptiveMaxPool2D) as maxima over PyTorch's bins."""
    return _twins.adaptive_pool_2d(x, _two(output_size), True)
