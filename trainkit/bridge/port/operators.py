"""What ``port`` writes for the tensor operators of Hugging Face ``transformers`` models (BERT, GPT-2, RoBERTa...).

BERT reads its token type ids with ``torch.gather``, GPT-2's ``Conv1D`` is ``torch.addmm`` and its GELU the tanh
formula with ``torch.pow``, RoBERTa numbers positions with ``cumsum``, attention masks are filled with
``masked_fill``/``where`` and softmax runs in a given dtype. Each entry renders the written arguments (code) as
MindSpore code computing the same thing; :mod:`trainkit.bridge.port.tables` merges these tables with the others.
"""
from __future__ import annotations

from typing import Callable, Dict

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
}
METHODS: Dict[str, Callable[..., str]] = {
    "gather": lambda self, dim, index: f"ops.gather_elements({self}, {dim}, {index})",
    "pow": lambda self, exponent: f"ops.pow({self}, {exponent})",
    "cumsum": _cumsum, "argmax": _argmax, "softmax": _softmax, "to": _to,
    "where": lambda self, condition, other: _where(condition, self, other),
    "new_ones": _new_filled("1"), "new_zeros": _new_filled("0"),
}
