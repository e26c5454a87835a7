"""What ``port`` writes for the tensor operators of Hugging Face ``transformers`` models (BERT, GPT-2, RoBERTa...).

BERT reads its token type ids with ``torch.gather``, GPT-2's ``Conv1D`` is ``torch.addmm`` and its GELU the tanh
formula with ``torch.pow``, RoBERTa numbers positions with ``cumsum``, attention masks are filled with
``masked_fill``/``where`` and softmax runs in a given dtype; MobileBERT makes its token type ids with
``torch.zeros``, MPNet buckets relative positions with ``abs``, ``log``, ``full_like`` and ``torch.min``. Each
entry renders the written arguments (code) as MindSpore code computing the same thing;
:mod:`trainkit.bridge.port.tables` merges these tables with the others.
"""
from __future__ import annotations

import ast
from typing import Callable, Dict, Optional

from trainkit.bridge.port.layers import Unsupported

#: Functions written into the generated module, for the operators MindSpore has no CPU kernel of.
HELPERS: Dict[str, str] = {
    "layer_norm": '''
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-05):
    """PyTorch's F.layer_norm over the last len(normalized_shape) axes (MindSpore's functional layer_norm has no
    CPU kernel; its LayerNorm primitive, nn.LayerNorm's, has)."""
    axis = x.ndim - len(normalized_shape)
    weight = ops.ones(normalized_shape, x.dtype) if weight is None else weight
    bias = ops.zeros(normalized_shape, x.dtype) if bias is None else bias
    return ops.LayerNorm(axis, axis, eps)(x, weight, bias)[0]
''',
}
#: The helper each function's code calls.
FUNCTION_HELPERS = {"torch.nn.functional.layer_norm": "layer_norm"}


def _scaled(term: str, factor: str) -> str:
    return term if factor in ("1", "1.0") else f"{factor} * {term}"


def _addmm(input, mat1, mat2, beta="1", alpha="1"):  # noqa: A002 - PyTorch's names
    return f"{_scaled(input, beta)} + {_scaled(f'ops.matmul({mat1}, {mat2})', alpha)}"


def _baddbmm(input, batch1, batch2, beta="1", alpha="1"):  # noqa: A002
    return f"{_scaled(input, beta)} + {_scaled(f'ops.bmm({batch1}, {batch2})', alpha)}"


def _cast(code: str, dtype: str) -> str:
    return code if dtype == "None" else f"{code}.astype({dtype})"


def _softmax(input, dim="None", _stacklevel="3", dtype="None"):  # noqa: A002
    if dim == "None":
        raise Unsupported("softmax without dim")
    return f"ops.softmax({_cast(input, dtype)}, axis={dim})"  # PyTorch casts the input first


def _cumsum(input, dim, dtype="None"):  # noqa: A002
    return f"ops.cumsum({_cast(input, dtype)}, {dim})"


def _where(condition, input, other):  # noqa: A002 - the one-argument form (nonzero) has no fixed shape
    return f"ops.where({condition}, {input}, {other})"


def _to(self, *args, **kwargs):
    """``x.to(dtype)``, ``x.to(other.dtype)``, ``x.to(device)``: a cast where a dtype is given, else ``x``."""
    dtype = kwargs.get("dtype", next((arg for arg in args if arg.startswith("ms.") or arg.endswith(".dtype")),
                                     "None"))
    return _cast(self, dtype)


def _new_filled(value: str) -> Callable[..., str]:
    def render(self, *size, dtype="None", device="None", requires_grad="False", layout="None", pin_memory="False"):
        shape = size[0] if len(size) == 1 else f"({', '.join(size)},)"
        return f"ops.full({shape}, {value}, dtype={f'{self}.dtype' if dtype == 'None' else dtype})"
    return render


def _argmax(input, dim="None", keepdim="False"):  # noqa: A002
    return f"ops.argmax({input}, {dim}, keepdim={keepdim})" if dim != "None" else f"ops.argmax({input})"


def _diff(input, n="1", dim="-1", prepend="None", append="None"):  # noqa: A002
    return f"ops.diff({input}, {n}, {dim}, {prepend}, {append})"


def _size(size) -> str:
    """A shape's code: ``torch.zeros(4, 5)``'s items, ``torch.zeros((4, 5))``'s tuple, a shape variable as it is."""
    if len(size) != 1:
        return f"({', '.join(size)},)"
    try:
        value = ast.literal_eval(size[0])
    except (ValueError, SyntaxError):
        return size[0]  # a variable holding a shape (transformers' input_shape)
    return f"({size[0]},)" if isinstance(value, int) else size[0]


def _fill_dtype(value: str, dtype: str) -> str:
    """PyTorch's dtype of a tensor filled with `value` where none is given: its default float (float32) for a
    float, int64 for an int, bool for a bool (``torch.full``'s inference); a computed value needs the dtype said."""
    if dtype != "None":
        return dtype
    try:
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError) as error:
        raise Unsupported(f"a tensor filled with a computed value {value} and no dtype") from error
    return {bool: "ms.bool_", int: "ms.int64", float: "ms.float32"}.get(type(literal), "ms.float32")


def _filled(value: Optional[str]) -> Callable[..., str]:
    """``torch.zeros``/``ones(*size, dtype=...)`` (`value` given), ``torch.full(size, fill_value, dtype=...)``
    (None): ``ops.full``; the device is MindSpore's choice."""
    def render(*size, fill_value=None, out="None", dtype="None", layout="None", device="None",
               requires_grad="False", pin_memory="False"):
        if value is None:  # torch.full(size, fill_value)
            if fill_value is None:
                size, fill_value = size[:-1], size[-1]
            return f"ops.full({_size(size)}, {fill_value}, dtype={_fill_dtype(fill_value, dtype)})"
        return f"ops.full({_size(size)}, {value}, dtype={'ms.float32' if dtype == 'None' else dtype})"
    return render


def _filled_like(value: Optional[str]) -> Callable[..., str]:
    """``torch.zeros_like``/``ones_like(input, dtype=...)`` and ``torch.full_like(input, fill_value, dtype=...)``:
    `input`'s shape, its dtype unless another is said."""
    def render(input, fill_value=None, dtype="None", layout="None", device="None",  # noqa: A002
               requires_grad="False", memory_format="None"):
        fill = value if value is not None else fill_value
        return f"ops.full_like({input}, {fill}{'' if dtype == 'None' else f', dtype={dtype}'})"
    return render


def _extremum(name: str) -> Callable[..., str]:
    """``torch.min(input, other)``/``torch.max``: the elementwise ``ops.minimum``/``maximum``; the reductions
    (``torch.min(x)``, ``torch.min(x, dim)``, values and indices) are refused."""
    def render(input, other="None", *rest, **kwargs):  # noqa: A002
        try:
            reduction = other == "None" or isinstance(ast.literal_eval(other), int) or rest or kwargs
        except (ValueError, SyntaxError):
            reduction = bool(rest or kwargs)
        if reduction:
            raise Unsupported(f"torch.{name[:3]} over a dim or the whole tensor (values and indices)")
        return f"ops.{name}({input}, {other})"
    return render


def _unary_op(name: str) -> Callable[..., str]:
    return lambda input, out="None": f"ops.{name}({input})"  # noqa: A002


FUNCTIONS: Dict[str, Callable[..., str]] = {
    "torch.gather": lambda input, dim, index, sparse_grad="False": f"ops.gather_elements({input}, {dim}, {index})",  # noqa: A002
    "torch.addmm": _addmm, "torch.baddbmm": _baddbmm, "torch.bmm": lambda input, mat2: f"ops.bmm({input}, {mat2})",  # noqa: A002
    "torch.pow": lambda input, exponent: f"ops.pow({input}, {exponent})",  # noqa: A002
    "torch.where": _where, "torch.cumsum": _cumsum, "torch.diff": _diff, "torch.argmax": _argmax,
    "torch.softmax": _softmax, "torch.nn.functional.softmax": _softmax,
    "torch.masked_fill": lambda input, mask, value: f"ops.masked_fill({input}, {mask}, {value})",  # noqa: A002
    "torch.nn.functional.layer_norm":
        lambda input, normalized_shape, weight="None", bias="None", eps="1e-05":  # noqa: A002
        f"layer_norm({input}, {normalized_shape}, {weight}, {bias}, {eps})",
    "torch.ne": lambda input, other: f"{input} != {other}", "torch.eq": lambda input, other: f"{input} == {other}",  # noqa: A002
    "torch.zeros": _filled("0"), "torch.ones": _filled("1"), "torch.full": _filled(None),
    "torch.zeros_like": _filled_like("0"), "torch.ones_like": _filled_like("1"), "torch.full_like": _filled_like(None),
    "torch.min": _extremum("minimum"), "torch.max": _extremum("maximum"),
    "torch.minimum": _extremum("minimum"), "torch.maximum": _extremum("maximum"),
    "torch.abs": _unary_op("abs"), "torch.log": _unary_op("log"), "torch.exp": _unary_op("exp"),
    "torch.sqrt": _unary_op("sqrt"), "torch.rsqrt": _unary_op("rsqrt"),
}
METHODS: Dict[str, Callable[..., str]] = {
    "gather": lambda self, dim, index: f"ops.gather_elements({self}, {dim}, {index})",
    "pow": lambda self, exponent: f"ops.pow({self}, {exponent})",
    "cumsum": _cumsum, "argmax": _argmax, "softmax": _softmax, "to": _to,
    "where": lambda self, condition, other: _where(condition, self, other),
    "new_ones": _new_filled("1"), "new_zeros": _new_filled("0"),
    "baddbmm": _baddbmm, "abs": lambda self: f"ops.abs({self})", "log": lambda self: f"ops.log({self})",
    "exp": lambda self: f"ops.exp({self})", "sqrt": lambda self: f"ops.sqrt({self})",
    "rsqrt": lambda self: f"ops.rsqrt({self})",
}
