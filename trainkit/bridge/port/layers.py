"""What ``port`` writes for each PyTorch layer, function and tensor method: MindSpore code with PyTorch's defaults.

A layer becomes a :class:`Call` (the constructor with every argument written out); the defaults that differ
between the two are carried explicitly: convolution padding (MindSpore's default is ``same``), ``has_bias``,
batch norm's momentum (MindSpore's is ``1 -`` PyTorch's), the epsilons, GELU's approximation (MindSpore's
default is tanh). Where MindSpore's layer names or lays out its parameters differently from PyTorch (Conv1d
adds an axis, Embedding calls its table ``embedding_table``), a small Cell written into the generated module
(:data:`HELPERS`) keeps PyTorch's names. The Transformer's layers, attention and dropout are
:mod:`trainkit.bridge.port.transformers`' (looked up first).
A function or method becomes one line of MindSpore code from its arguments, bound to PyTorch's signature.
"""
from __future__ import annotations

import ast
import inspect
import keyword
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple


class Unsupported(Exception):
    """A layer, function or method ``port`` has no MindSpore counterpart for (the message says which and why)."""


@dataclass
class Call:
    """A constructor call: ``callee(*args, **kwargs)``; values are literals, Calls or lists of them."""

    callee: str
    kwargs: Dict[str, Any] = field(default_factory=dict)
    args: List[Any] = field(default_factory=list)
    helper: Optional[str] = None  # the name of the HELPERS entry the callee needs


# ------------------------------------------------------------------- helper Cells written into the generated module
HELPERS: Dict[str, str] = {
    "Conv1d": '''
class Conv1d(nn.Cell):
    """PyTorch's Conv1d: the weight laid out (out, in/groups, k) as PyTorch does (MindSpore's Conv1d adds an axis)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__()
        bound = 1 / math.sqrt(in_channels // groups * kernel_size)
        self.weight = Parameter(initializer(Uniform(bound), (out_channels, in_channels // groups, kernel_size)),
                                name="weight")
        self.bias = Parameter(initializer(Uniform(bound), (out_channels,)), name="bias") if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def construct(self, x):
        return ops.conv1d(x, self.weight, self.bias, self.stride, "pad", self.padding, self.dilation, self.groups)
''',
    "Embedding": '''
class Embedding(nn.Cell):
    """PyTorch's Embedding: the table is called ``weight`` (MindSpore's Embedding calls it embedding_table); with
    ``padding_idx``, that row takes no gradient, as in PyTorch (a pad token's vector stays as it was)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        self.weight = Parameter(initializer(Normal(1.0), (num_embeddings, embedding_dim)), name="weight")
        self.padding_idx = padding_idx

    def construct(self, ids):
        vectors = ops.gather(self.weight, ids, 0)
        if self.padding_idx is None:
            return vectors
        return ops.where(ops.expand_dims(ids == self.padding_idx, -1), ops.stop_gradient(vectors), vectors)
''',
}
#: The imports each helper needs beyond ``from mindspore import nn, ops``.
HELPER_IMPORTS = {"Conv1d": ("math", "initializer"), "Embedding": ("initializer",)}


# ------------------------------------------------------------------- layers
def _pair(value: Any) -> Tuple[int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)  # type: ignore[return-value]


def _short(value: Any) -> Any:
    """``3`` for ``(3, 3)`` and ``(3, 3, 3, 3)``: the same number on every side, written once."""
    if isinstance(value, tuple) and value and all(item == value[0] for item in value):
        return value[0]
    return value


def _single(value: Any) -> int:
    return value[0] if isinstance(value, (tuple, list)) else value


def _conv2d(m) -> Call:
    if m.padding_mode != "zeros":
        raise Unsupported(f"padding_mode={m.padding_mode!r} (only 'zeros')")
    kwargs: Dict[str, Any] = {"in_channels": m.in_channels, "out_channels": m.out_channels,
                              "kernel_size": _short(_pair(m.kernel_size)), "stride": _short(_pair(m.stride))}
    if isinstance(m.padding, str):
        kwargs["pad_mode"] = m.padding
    else:
        (top, left) = _pair(m.padding)
        kwargs.update(pad_mode="pad", padding=_short((top, top, left, left)))
    if _pair(m.dilation) != (1, 1):
        kwargs["dilation"] = _short(_pair(m.dilation))
    if m.groups != 1:
        kwargs["group"] = m.groups
    kwargs["has_bias"] = m.bias is not None
    return Call("nn.Conv2d", kwargs)


def _conv1d(m) -> Call:
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        raise Unsupported(f"padding={m.padding!r}, padding_mode={m.padding_mode!r} (only numbers and 'zeros')")
    return Call("Conv1d", {"in_channels": m.in_channels, "out_channels": m.out_channels,
                           "kernel_size": _single(m.kernel_size), "stride": _single(m.stride),
                           "padding": _single(m.padding), "dilation": _single(m.dilation), "groups": m.groups,
                           "bias": m.bias is not None}, helper="Conv1d")


def _batch_norm(callee: str) -> Callable:
    def spec(m) -> Call:
        if m.momentum is None:
            raise Unsupported("momentum=None (a cumulative average; MindSpore has an exponential one only)")
        if not m.affine:
            raise Unsupported("affine=False")
        kwargs = {"num_features": m.num_features, "eps": m.eps, "momentum": 1.0 - m.momentum}
        if not m.track_running_stats:
            kwargs["use_batch_statistics"] = True
        return Call(callee, kwargs)
    return spec


def _layer_norm(m) -> Call:
    if not m.elementwise_affine or getattr(m, "bias", True) is None:
        raise Unsupported("elementwise_affine=False or bias=False")
    axes = -len(m.normalized_shape)
    return Call("nn.LayerNorm", {"normalized_shape": tuple(m.normalized_shape), "begin_norm_axis": axes,
                                 "begin_params_axis": axes, "epsilon": m.eps})


def _group_norm(m) -> Call:
    if not m.affine:
        raise Unsupported("affine=False")
    return Call("nn.GroupNorm", {"num_groups": m.num_groups, "num_channels": m.num_channels, "eps": m.eps})


def _embedding(m) -> Call:
    if m.max_norm is not None or m.sparse:
        raise Unsupported("max_norm or sparse")
    padding = {} if m.padding_idx is None else {"padding_idx": int(m.padding_idx)}  # PyTorch's: made non-negative
    return Call("Embedding", {"num_embeddings": m.num_embeddings, "embedding_dim": m.embedding_dim, **padding},
                helper="Embedding")


def _recurrent(callee: str) -> Callable:
    def spec(m) -> Call:
        if getattr(m, "proj_size", 0):
            raise Unsupported("proj_size")
        return Call(callee, {"input_size": m.input_size, "hidden_size": m.hidden_size, "num_layers": m.num_layers,
                             "has_bias": m.bias, "batch_first": m.batch_first, "dropout": float(m.dropout),
                             "bidirectional": m.bidirectional})
    return spec


def _pool(callee: str, average: bool, dims: int) -> Callable:
    def spec(m) -> Call:
        size = (lambda value: _short(_pair(value))) if dims == 2 else _single
        kwargs = {"kernel_size": size(m.kernel_size), "stride": size(m.stride or m.kernel_size)}
        padding = size(m.padding)
        if padding != size(0) or m.ceil_mode:
            kwargs.update(pad_mode="pad", padding=padding)
        if not average and size(getattr(m, "dilation", 1)) != size(1):
            kwargs["dilation"] = size(m.dilation)
        kwargs["ceil_mode"] = m.ceil_mode
        if average:
            kwargs["count_include_pad"] = m.count_include_pad
            if dims == 2 and m.divisor_override is not None:
                kwargs["divisor_override"] = m.divisor_override
        elif getattr(m, "return_indices", False):
            raise Unsupported("return_indices=True")
        return Call(callee, kwargs)
    return spec


def _adaptive(callee: str, dims: int) -> Callable:
    def spec(m) -> Call:
        if getattr(m, "return_indices", False):
            raise Unsupported("return_indices=True")
        size = m.output_size
        if dims == 1:
            return Call(callee, {"output_size": _single(size)})
        return Call(callee, {"output_size": _pair(size)})  # MindSpore's bins are PyTorch's, None keeps a side
    return spec


def _softmax(m) -> Call:
    if m.dim is None:
        raise Unsupported("dim=None (give the axis)")
    return Call("nn.Softmax", {"axis": m.dim})


LAYERS: Dict[str, Callable[[Any], Call]] = {
    "Conv1d": _conv1d, "Conv2d": _conv2d,
    "BatchNorm1d": _batch_norm("nn.BatchNorm1d"), "BatchNorm2d": _batch_norm("nn.BatchNorm2d"),
    "LayerNorm": _layer_norm, "GroupNorm": _group_norm,
    "Linear": lambda m: Call("nn.Dense", {"in_channels": m.in_features, "out_channels": m.out_features,
                                          "has_bias": m.bias is not None}),
    "Embedding": _embedding, "LSTM": _recurrent("nn.LSTM"), "GRU": _recurrent("nn.GRU"),
    "MaxPool1d": _pool("nn.MaxPool1d", False, 1), "MaxPool2d": _pool("nn.MaxPool2d", False, 2),
    "AvgPool1d": _pool("nn.AvgPool1d", True, 1), "AvgPool2d": _pool("nn.AvgPool2d", True, 2),
    "AdaptiveAvgPool1d": _adaptive("nn.AdaptiveAvgPool1d", 1),
    "AdaptiveAvgPool2d": _adaptive("nn.AdaptiveAvgPool2d", 2),
    "AdaptiveMaxPool1d": _adaptive("nn.AdaptiveMaxPool1d", 1),
    "AdaptiveMaxPool2d": _adaptive("nn.AdaptiveMaxPool2d", 2),
    "Flatten": lambda m: Call("nn.Flatten", {"start_dim": m.start_dim, "end_dim": m.end_dim}),
    "Identity": lambda m: Call("nn.Identity"),
    "ReLU": lambda m: Call("nn.ReLU"), "ReLU6": lambda m: Call("nn.ReLU6"),
    "Hardswish": lambda m: Call("nn.HSwish"), "Hardsigmoid": lambda m: Call("nn.HSigmoid"),
    "GELU": lambda m: Call("nn.GELU", {"approximate": m.approximate == "tanh"}),
    "SiLU": lambda m: Call("nn.SiLU"), "Sigmoid": lambda m: Call("nn.Sigmoid"), "Tanh": lambda m: Call("nn.Tanh"),
    "LeakyReLU": lambda m: Call("nn.LeakyReLU", {"alpha": m.negative_slope}),
    "Softmax": _softmax,
}
CONTAINERS = {"Sequential": "nn.SequentialCell", "ModuleList": "nn.CellList"}


def layer_call(module: Any) -> Call:
    """The MindSpore constructor call of a PyTorch layer (a ``torch.nn`` class of :data:`LAYERS`).

    Raises:
        Unsupported: the class is not covered, or one of its options is not.
    """
    name = type(module).__name__
    if name not in LAYERS or not type(module).__module__.startswith("torch.nn"):
        raise Unsupported(f"torch.nn.{name}")
    try:
        return LAYERS[name](module)
    except Unsupported as error:
        raise Unsupported(f"torch.nn.{name} with {error}") from error


# ------------------------------------------------------------------- functions and tensor methods
# Each renders one expression from its arguments already written as code (strings), bound to PyTorch's signature.
def _attribute_name(code: str) -> str:
    """The attribute a traced ``getattr(x, "name")`` reads, from the code of its literal; Unsupported unless it is
    an ASCII Python name (anything else would be written into the code as it is)."""
    try:
        name = ast.literal_eval(code)
    except (ValueError, SyntaxError):
        name = None
    if not (isinstance(name, str) and name.isascii() and name.isidentifier() and not keyword.iskeyword(name)):
        raise Unsupported(f"getattr of a computed or non-identifier attribute ({code})")
    return name


def _dims(*dims) -> str:
    """``view(2, 3)`` and ``view((2, 3))`` alike: the shape as a tuple's code."""
    if len(dims) == 1 and dims[0].startswith(("(", "[")):
        return dims[0]
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"


def _mean(input, dim="None", keepdim="False", dtype="None"):  # noqa: A002 - PyTorch's argument names
    return f"ops.mean({input}, {dim}, keep_dims={keepdim})" if dim != "None" else f"ops.mean({input})"


def _sum(input, dim="None", keepdim="False", dtype="None"):  # noqa: A002
    if dtype != "None":
        raise Unsupported("Tensor.sum with dtype")
    return f"ops.sum({input}, {dim}, keepdim={keepdim})" if dim != "None" else f"ops.sum({input})"


def _add(input, other, alpha="1"):  # noqa: A002
    return f"{input} + {other}" if alpha == "1" else f"{input} + {alpha} * {other}"


def _flatten(input, start_dim="0", end_dim="-1"):  # noqa: A002
    return f"ops.flatten({input}, start_dim={start_dim}, end_dim={end_dim})"


def _softmax_call(input, dim="None", _stacklevel="3", dtype="None"):  # noqa: A002
    if dim == "None":
        raise Unsupported("softmax without dim")
    return f"ops.softmax({input}, axis={dim})"


def _size(input, dim="None"):  # noqa: A002
    return f"{input}.shape" if dim == "None" else f"{input}.shape[{dim}]"


def _max_pool2d(input, kernel_size, stride="None", padding="0", dilation="1", ceil_mode="False",  # noqa: A002
                return_indices="False"):
    stride = kernel_size if stride in ("None", "()", "[]") else stride
    return f"ops.max_pool2d({input}, {kernel_size}, {stride}, {padding}, {dilation}, ceil_mode={ceil_mode})"


def _avg_pool2d(input, kernel_size, stride="None", padding="0", ceil_mode="False",  # noqa: A002
                count_include_pad="True", divisor_override="None"):
    stride = kernel_size if stride in ("None", "()", "[]") else stride
    divisor = "" if divisor_override == "None" else f", divisor_override={divisor_override}"  # MindSpore: an int
    return (f"ops.avg_pool2d({input}, {kernel_size}, {stride}, {padding}, ceil_mode={ceil_mode}, "
            f"count_include_pad={count_include_pad}{divisor})")


def _adaptive_pool(kind: str) -> Callable:
    def render(input, output_size, return_indices="False"):  # noqa: A002
        if return_indices != "False":
            raise Unsupported("return_indices=True")
        if kind == "avg" and output_size in ("1", "(1, 1)", "[1, 1]"):
            return f"ops.mean({input}, (2, 3), keep_dims=True)"
        return f"ops.adaptive_{kind}_pool2d({input}, {output_size})"
    return render


def _adaptive_avg_pool1d(input, output_size):  # noqa: A002
    if output_size in ("1", "(1,)", "[1]"):
        return f"ops.mean({input}, -1, keep_dims=True)"
    return f"ops.adaptive_avg_pool1d({input}, {output_size})"


def _dropout(input, p="0.5", training="True", inplace="False"):  # noqa: A002
    return f"ops.dropout({input}, p={p}, training=self.training)"


def _gelu(input, approximate="'none'"):  # noqa: A002
    return f"ops.gelu({input}, approximate={approximate})"


def _leaky_relu(input, negative_slope="0.01", inplace="False"):  # noqa: A002
    return f"ops.leaky_relu({input}, {negative_slope})"


def _unary(op: str) -> Callable:
    def render(input, inplace="False"):  # noqa: A002
        return f"ops.{op}({input})"
    return render


def _binary(symbol: str) -> Callable:
    return lambda input, other: f"{input} {symbol} {other}"  # noqa: A002


FUNCTIONS: Dict[str, Callable[..., str]] = {
    # qualified names of the call targets fx records (operator.*, torch.*, torch.nn.functional.*)
    "operator.add": _binary("+"), "operator.sub": _binary("-"), "operator.mul": _binary("*"),
    "operator.truediv": _binary("/"), "operator.matmul": _binary("@"),
    "operator.neg": lambda input: f"-{input}",  # noqa: A002
    "operator.getitem": lambda value, index: f"{value}[{index}]",
    "builtins.getattr": lambda value, name: f"{value}.{_attribute_name(name)}",
    "torch.add": _add, "torch.mul": lambda input, other: f"{input} * {other}",  # noqa: A002
    "torch.cat": lambda tensors, dim="0": f"ops.cat({tensors}, axis={dim})",
    "torch.flatten": _flatten,
    "torch.reshape": lambda input, shape: f"ops.reshape({input}, {shape})",  # noqa: A002
    "torch.permute": lambda input, dims: f"ops.permute({input}, {dims})",  # noqa: A002
    "torch.transpose": lambda input, dim0, dim1: f"ops.swapaxes({input}, {dim0}, {dim1})",  # noqa: A002
    "torch.swapaxes": lambda input, axis0, axis1: f"ops.swapaxes({input}, {axis0}, {axis1})",  # noqa: A002
    "torch.mean": _mean, "torch.sum": _sum, "torch.matmul": lambda input, other: f"ops.matmul({input}, {other})",  # noqa: A002
    "torch.relu": _unary("relu"), "torch.sigmoid": _unary("sigmoid"), "torch.tanh": _unary("tanh"),
    "torch.softmax": _softmax_call,
    "torch.nn.functional.relu": _unary("relu"), "torch.nn.functional.gelu": _gelu,
    "torch.nn.functional.silu": _unary("silu"), "torch.nn.functional.sigmoid": _unary("sigmoid"),
    "torch.nn.functional.tanh": _unary("tanh"), "torch.nn.functional.leaky_relu": _leaky_relu,
    "torch.nn.functional.softmax": _softmax_call, "torch.nn.functional.dropout": _dropout,
    "torch.nn.functional.max_pool2d": _max_pool2d, "torch.nn.functional.avg_pool2d": _avg_pool2d,
    "torch.nn.functional.adaptive_avg_pool2d": _adaptive_pool("avg"),
    "torch.nn.functional.adaptive_max_pool2d": _adaptive_pool("max"),
    "torch.nn.functional.relu6": _unary("relu6"), "torch.nn.functional.hardswish": _unary("hardswish"),
    "torch.nn.functional.hardsigmoid": _unary("hardsigmoid"),
    "torch.nn.functional.adaptive_avg_pool1d": _adaptive_avg_pool1d,
}
METHODS: Dict[str, Callable[..., str]] = {
    "view": lambda self, *shape: f"ops.reshape({self}, {_dims(*shape)})",
    "reshape": lambda self, *shape: f"ops.reshape({self}, {_dims(*shape)})",
    "flatten": lambda self, start_dim="0", end_dim="-1": _flatten(self, start_dim, end_dim),
    "permute": lambda self, *dims: f"ops.permute({self}, {_dims(*dims)})",
    "transpose": lambda self, dim0, dim1: f"ops.swapaxes({self}, {dim0}, {dim1})",
    "swapaxes": lambda self, axis0, axis1: f"ops.swapaxes({self}, {axis0}, {axis1})",
    "mean": lambda self, dim="None", keepdim="False", dtype="None": _mean(self, dim, keepdim),
    "sum": lambda self, dim="None", keepdim="False", dtype="None": _sum(self, dim, keepdim, dtype),
    "size": _size, "contiguous": lambda self: self,
    "relu": lambda self: f"ops.relu({self})", "sigmoid": lambda self: f"ops.sigmoid({self})",
    "tanh": lambda self: f"ops.tanh({self})", "softmax": lambda self, dim: f"ops.softmax({self}, axis={dim})",
    "unsqueeze": lambda self, dim: f"ops.expand_dims({self}, {dim})",
    "squeeze": lambda self, dim="None": f"ops.squeeze({self}, {dim})" if dim != "None" else f"ops.squeeze({self})",
    "add": lambda self, other: f"{self} + {other}", "mul": lambda self, other: f"{self} * {other}",
    "matmul": lambda self, other: f"ops.matmul({self}, {other})",
}


def target_name(target: Any) -> str:
    """``torch.nn.functional.relu`` for a function fx recorded (operator.add, torch.cat...)."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", repr(target))
    if getattr(F, name, None) is target:
        return f"torch.nn.functional.{name}"
    if getattr(torch, name, None) is target:
        return f"torch.{name}"
    module = getattr(target, "__module__", None) or ""
    return f"{'operator' if module == '_operator' else module}.{name}"


def render_call(renderer: Callable[..., str], args: Tuple[str, ...], kwargs: Dict[str, str], what: str) -> str:
    """`renderer` bound to the written arguments like PyTorch binds them; Unsupported when they do not fit."""
    try:
        inspect.signature(renderer).bind(*args, **kwargs)
    except TypeError as error:
        raise Unsupported(f"{what} with arguments ({', '.join([*args, *(f'{k}={v}' for k, v in kwargs.items())])}): "
                          f"{error}") from error
    return renderer(*args, **kwargs)


