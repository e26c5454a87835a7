"""What ``port`` writes for the transformer idioms: attention layers, dropout, and the functions and tensor methods
people write transformers with (``einsum``, ``scaled_dot_product_attention``, ``chunk``/``split``, ``arange``,
``expand``/``repeat``, masks compared from token ids).

These tables extend :mod:`trainkit.bridge.port.layers`' and take precedence over them where both name a layer
(``MultiheadAttention``, ``TransformerEncoderLayer``, ``TransformerEncoder``, ``Dropout``): every dropout a port
writes is trainkit's counter-based :class:`trainkit.models.dropout.Dropout`, whose stream a checkpoint holds, so a
ported model resumes bitwise and two runs with one seed are equal; attention is written out here with that dropout
rather than MindSpore's ``nn.MultiheadAttention``, whose dropout draws from a kernel's hidden state.
"""
from __future__ import annotations

import ast
from typing import Any, Callable, Dict, List

from trainkit.bridge.port.layers import Call, Unsupported, _layer_norm

# ------------------------------------------------------------------- helpers written into the generated module
HELPERS: Dict[str, str] = {
    "scaled_dot_product_attention": '''
def scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """PyTorch's F.scaled_dot_product_attention without dropout: a boolean mask keeps where True, a float mask adds;
    is_causal keeps each position and the ones before it."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = ops.matmul(query, key.swapaxes(-2, -1)) * scale
    if is_causal:
        attn_mask = ops.tril(ops.ones((scores.shape[-2], scores.shape[-1]), ms.int32)).astype(ms.bool_)
    if attn_mask is not None:
        if attn_mask.dtype == ms.bool_:
            scores = ops.masked_fill(scores, ops.logical_not(attn_mask), float("-inf"))
        else:
            scores = scores + attn_mask
    return ops.matmul(ops.softmax(scores, -1), value)
''',
    "MultiheadAttention": '''
class MultiheadAttention(nn.Cell):
    """PyTorch's MultiheadAttention (query, key and value of one size), its parameter names (in_proj_weight,
    in_proj_bias, out_proj) and its dropout on the attention weights, drawn by trainkit's resumable Dropout."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False):
        super().__init__()
        self.num_heads, self.head_dim, self.batch_first = num_heads, embed_dim // num_heads, batch_first
        bound = math.sqrt(6 / (4 * embed_dim))
        self.in_proj_weight = Parameter(initializer(Uniform(bound), (3 * embed_dim, embed_dim)), name="in_proj_weight")
        self.in_proj_bias = Parameter(initializer("zeros", (3 * embed_dim,)), name="in_proj_bias") if bias else None
        self.out_proj = nn.Dense(embed_dim, embed_dim, has_bias=bias)
        self.dropout = Dropout(dropout)

    def construct(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None):
        if not self.batch_first:
            query, key, value = query.swapaxes(0, 1), key.swapaxes(0, 1), value.swapaxes(0, 1)
        q_weight, k_weight, v_weight = ops.chunk(self.in_proj_weight, 3)
        q_bias, k_bias, v_bias = ops.chunk(self.in_proj_bias, 3) if self.in_proj_bias is not None else (None,) * 3
        q = self._heads(ops.dense(query, q_weight, q_bias))
        k = self._heads(ops.dense(key, k_weight, k_bias))
        v = self._heads(ops.dense(value, v_weight, v_bias))
        scores = ops.matmul(q, k.swapaxes(-2, -1)) * (self.head_dim ** -0.5)
        if attn_mask is not None:
            scores = _masked(scores, attn_mask)
        if key_padding_mask is not None:
            scores = _masked(scores, key_padding_mask[:, None, None, :])
        weights = ops.softmax(scores, -1)
        x = ops.matmul(self.dropout(weights), v)
        batch, _, steps, _ = x.shape
        x = self.out_proj(x.swapaxes(1, 2).reshape(batch, steps, -1))
        if not self.batch_first:
            x = x.swapaxes(0, 1)
        return x, (weights.mean(1) if need_weights else None)

    def _heads(self, x):
        batch, steps, _ = x.shape
        return x.reshape(batch, steps, self.num_heads, self.head_dim).swapaxes(1, 2)


def _masked(scores, mask):
    """PyTorch's attention masks: True (boolean) hides a position, a float mask is added."""
    if mask.dtype == ms.bool_:
        return ops.masked_fill(scores, mask, float("-inf"))
    return scores + mask
''',
    "TransformerEncoderLayer": '''
class TransformerEncoderLayer(nn.Cell):
    """PyTorch's TransformerEncoderLayer with its names (linear1/linear2, norm1/norm2) and its order of operations;
    `activation` is PyTorch's: "relu", "gelu" or a layer."""

    def __init__(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                 norm_first, bias=True):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = nn.Dense(d_model, dim_feedforward, has_bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Dense(dim_feedforward, d_model, has_bias=bias)
        self.norm1 = nn.LayerNorm((d_model,), epsilon=layer_norm_eps)
        self.norm2 = nn.LayerNorm((d_model,), epsilon=layer_norm_eps)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            if activation not in ACTIVATIONS:
                raise ValueError(f"activation={activation!r} is not valid: use one of {sorted(ACTIVATIONS)} or a layer")
            activation = ACTIVATIONS[activation]()
        self.activation = activation
        self.norm_first = norm_first

    def construct(self, src, src_mask=None, src_key_padding_mask=None):
        x = src
        if self.norm_first:
            x = x + self._attention(self.norm1(x), src_mask, src_key_padding_mask)
            x = x + self._feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self._attention(x, src_mask, src_key_padding_mask))
            x = self.norm2(x + self._feed_forward(x))
        return x

    def _attention(self, x, mask, key_padding_mask):
        x = self.self_attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False, attn_mask=mask)[0]
        return self.dropout1(x)

    def _feed_forward(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


#: PyTorch's activation names for TransformerEncoderLayer, as MindSpore layers (GELU exact, as PyTorch's).
ACTIVATIONS = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate=False)}
''',
    "TransformerEncoder": '''
class TransformerEncoder(nn.Cell):
    """PyTorch's TransformerEncoder: its layers in turn (``layers.N``), then the optional final norm."""

    def __init__(self, layers, norm=None):
        super().__init__()
        self.layers = nn.CellList(layers)
        self.norm = norm

    def construct(self, src, mask=None, src_key_padding_mask=None):
        x = src
        for layer in self.layers:
            x = layer(x, mask, src_key_padding_mask)
        if self.norm is not None:
            x = self.norm(x)
        return x
''',
}
#: The imports each helper needs beyond ``from mindspore import nn, ops`` (``dropout``: trainkit's Dropout).
HELPER_IMPORTS = {"scaled_dot_product_attention": ("ms",), "MultiheadAttention": ("ms", "math", "initializer",
                                                                                  "dropout"),
                  "TransformerEncoderLayer": ("dropout",), "Dropout": ("dropout",)}
#: Helpers another helper needs written before it.
HELPER_NEEDS = {"TransformerEncoderLayer": ("MultiheadAttention",), "TransformerEncoder": ("TransformerEncoderLayer",)}


# ------------------------------------------------------------------- layers
def _dropout_layer(m) -> Call:
    return Call("Dropout", {"p": m.p}, helper="Dropout")


def _attention(m) -> Call:
    if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
        raise Unsupported("kdim/vdim, add_bias_kv or add_zero_attn")
    return Call("MultiheadAttention", {"embed_dim": m.embed_dim, "num_heads": m.num_heads, "dropout": m.dropout,
                                       "bias": m.in_proj_bias is not None, "batch_first": m.batch_first},
                helper="MultiheadAttention")


def _activation(m) -> Any:
    """PyTorch's value of the layer's activation: "relu"/"gelu" for its functions, else the layer it holds."""
    import torch.nn.functional as F  # noqa: N812 - PyTorch's spelling

    if m.activation is F.relu:
        return "relu"
    if m.activation is F.gelu:
        return "gelu"
    from trainkit.bridge.port.layers import layer_call

    if hasattr(m.activation, "named_children"):
        return layer_call(m.activation)
    raise Unsupported(f"activation={getattr(m.activation, '__name__', m.activation)!r} (relu, gelu or a torch.nn "
                      "layer)")


def _encoder_layer(m) -> Call:
    return Call("TransformerEncoderLayer", {
        "d_model": m.linear1.in_features, "nhead": m.self_attn.num_heads,
        "dim_feedforward": m.linear1.out_features, "dropout": m.dropout.p, "activation": _activation(m),
        "layer_norm_eps": m.norm1.eps, "batch_first": m.self_attn.batch_first, "norm_first": m.norm_first,
        "bias": m.linear1.bias is not None}, helper="TransformerEncoderLayer")


def _encoder(m) -> Call:
    return Call("TransformerEncoder", {"layers": [_encoder_layer(layer) for layer in m.layers],
                                       "norm": _layer_norm(m.norm) if m.norm is not None else None},
                helper="TransformerEncoder")


LAYERS: Dict[str, Callable[[Any], Call]] = {
    "Dropout": _dropout_layer, "MultiheadAttention": _attention, "TransformerEncoderLayer": _encoder_layer,
    "TransformerEncoder": _encoder,
}


def same_as_layer_norm(module: Any) -> bool:
    """Whether `module`, a subclass of ``nn.LayerNorm`` from outside torch (timm's), computes ``F.layer_norm``
    of its input with its own shape, weight, bias and epsilon and nothing else (read from its fx trace)."""
    import torch
    import torch.fx
    import torch.nn.functional as F  # noqa: N812

    if not isinstance(module, torch.nn.LayerNorm) or not module.elementwise_affine:
        return False
    try:
        graph = torch.fx.Tracer().trace(module)
    except Exception:  # noqa: BLE001 - untraceable: not recognised, traced as its own class later
        return False
    calls = [node for node in graph.nodes if node.op in ("call_function", "call_method", "call_module")]
    if len(calls) != 1 or calls[0].target is not F.layer_norm:
        return False
    args = list(calls[0].args) + list(calls[0].kwargs.values())
    attributes = [arg.target for arg in args if getattr(arg, "op", None) == "get_attr"]
    constants = [arg for arg in args if getattr(arg, "op", None) is None]
    return attributes == ["weight", "bias"] and tuple(constants[0]) == tuple(module.normalized_shape) \
        and constants[-1] == module.eps


# ------------------------------------------------------------------- functions and tensor methods
def _literal(code: str) -> Any:
    try:
        return ast.literal_eval(code)
    except (ValueError, SyntaxError) as error:
        raise Unsupported(f"a computed argument {code}") from error


def _einsum(equation, *operands) -> str:
    """``torch.einsum`` as MindSpore operations (MindSpore's einsum has no CPU kernel): one operand permuted and
    summed; two as a batched matmul where each of the free and summed groups is one letter, else broadcast, multiply
    and sum."""
    text = str(_literal(equation)).replace(" ", "")
    if len(operands) == 1 and isinstance(operands[0], str) and operands[0].startswith("["):
        operands = tuple(part.strip() for part in operands[0][1:-1].split(","))
    if "..." in text or "->" not in text:
        raise Unsupported(f"einsum {text!r} (explicit '->' without '...')")
    inputs, output = text.split("->")
    labels = inputs.split(",")
    if len(labels) != len(operands) or len(labels) > 2:
        raise Unsupported(f"einsum {text!r} (one or two operands)")
    if len(labels) == 1:
        (a,), (x,) = labels, operands
        summed = [index for index, label in enumerate(a) if label not in output]
        kept = [label for label in a if label in output]
        code = f"ops.sum({x}, {tuple(summed)})" if summed else x
        order = tuple(kept.index(label) for label in output)
        return code if order == tuple(range(len(order))) else f"ops.permute({code}, {order})"
    (a, b), (x, y) = labels, operands
    batch = [label for label in output if label in a and label in b]
    free_a = [label for label in output if label in a and label not in b]
    free_b = [label for label in output if label in b and label not in a]
    summed = [label for label in a if label in b and label not in output]
    if len(free_a) <= 1 and len(free_b) <= 1 and len(summed) <= 1 and set(a) <= set(output) | set(b) \
            and set(b) <= set(output) | set(a):
        left = _arranged(x, a, batch + free_a + summed, len(free_a) == 0, -2)
        right = _arranged(y, b, batch + summed + free_b, len(free_b) == 0, -1)
        if not summed:
            left, right = f"ops.expand_dims({left}, -1)", f"ops.expand_dims({right}, -2)"
        product = f"ops.matmul({left}, {right})"
        if not free_a:
            product = f"ops.squeeze({product}, -2)" if free_b else f"ops.squeeze({product}, (-2, -1))"
        elif not free_b:
            product = f"ops.squeeze({product}, -1)"
        got = batch + free_a + free_b
        order = tuple(got.index(label) for label in output)
        return product if order == tuple(range(len(order))) else f"ops.permute({product}, {order})"
    every = list(output) + [label for label in dict.fromkeys(a + b) if label not in output]
    left, right = _aligned(x, a, every), _aligned(y, b, every)
    extra = tuple(range(len(output), len(every)))
    return f"ops.sum({left} * {right}, {extra})" if extra else f"{left} * {right}"


def _arranged(x: str, labels: str, order: List[str], insert: bool, axis: int) -> str:
    perm = tuple(labels.index(label) for label in order)
    code = x if perm == tuple(range(len(labels))) else f"ops.permute({x}, {perm})"
    return f"ops.expand_dims({code}, {axis})" if insert else code


def _aligned(x: str, labels: str, every: List[str]) -> str:
    """`x` permuted to `every`'s order, with a length-1 axis for each label it lacks (broadcast)."""
    present = [label for label in every if label in labels]
    perm = tuple(labels.index(label) for label in present)
    code = x if perm == tuple(range(len(labels))) else f"ops.permute({x}, {perm})"
    index = ", ".join(":" if label in labels else "None" for label in every)
    return code if len(present) == len(every) else f"{code}[{index}]"


def _sdpa(query, key, value, attn_mask="None", dropout_p="0.0", is_causal="False", scale="None",
          enable_gqa="False"):
    if _literal(dropout_p) != 0 or _literal(enable_gqa):
        raise Unsupported("scaled_dot_product_attention with dropout_p or enable_gqa")
    options = [f"{name}={code}" for name, code, default in [("attn_mask", attn_mask, "None"),
                                                             ("is_causal", is_causal, "False"),
                                                             ("scale", scale, "None")] if code != default]
    return f"scaled_dot_product_attention({', '.join([query, key, value, *options])})"


def _arange(*args, out="None", dtype="None", layout="None", device="None", requires_grad="False",
            pin_memory="False"):
    bounds = ", ".join(args)
    return f"ops.arange({bounds}{'' if dtype == 'None' else f', dtype={dtype}'})"


def _split(self, split_size_or_sections, dim="0"):
    return f"ops.split({self}, {split_size_or_sections}, axis={dim})"


def _chunk(self, chunks, dim="0"):
    return f"ops.chunk({self}, {chunks}, axis={dim})"


def _masked_fill(self, mask, value):
    return f"ops.masked_fill({self}, {mask}, {value})"


def _shape(*dims) -> str:
    if len(dims) == 1 and dims[0].startswith(("(", "[")):
        return dims[0]
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"


def _compare(symbol: str) -> Callable:
    return lambda a, b: f"{a} {symbol} {b}"


FUNCTIONS: Dict[str, Callable[..., str]] = {
    "torch.einsum": _einsum, "torch.functional.einsum": _einsum,
    "torch.nn.functional.scaled_dot_product_attention": _sdpa, "torch.arange": _arange,
    "torch.split": _split, "torch.chunk": _chunk, "torch.unbind": lambda input, dim="0": f"ops.unbind({input}, {dim})",  # noqa: A002
    "torch.masked_fill": _masked_fill,
    "operator.ne": _compare("!="), "operator.eq": _compare("=="), "operator.lt": _compare("<"),
    "operator.le": _compare("<="), "operator.gt": _compare(">"), "operator.ge": _compare(">="),
    "operator.floordiv": _compare("//"), "operator.mod": _compare("%"), "operator.invert": lambda a: f"~{a}",
    "operator.and_": _compare("&"), "operator.or_": _compare("|"), "operator.pow": _compare("**"),
}
#: The helper each function's code calls.
FUNCTION_HELPERS = {"torch.nn.functional.scaled_dot_product_attention": "scaled_dot_product_attention"}
#: Calls that only check, written as nothing (a shape assertion holds for the shape the port was made for).
SKIPPED = {"torch._assert", "torch._C._log_api_usage_once", "torch.fx._symbolic_trace._assert_is_none"}
METHODS: Dict[str, Callable[..., str]] = {
    "chunk": _chunk, "split": _split, "unbind": lambda self, dim="0": f"ops.unbind({self}, {dim})",
    "expand": lambda self, *sizes: f"ops.broadcast_to({self}, {_shape(*sizes)})",
    "repeat": lambda self, *sizes: f"ops.tile({self}, {_shape(*sizes)})",
    "masked_fill": _masked_fill, "dim": lambda self: f"{self}.ndim",
    "float": lambda self: f"{self}.astype(ms.float32)", "bool": lambda self: f"{self}.astype(ms.bool_)",
    "long": lambda self: f"{self}.astype(ms.int64)", "int": lambda self: f"{self}.astype(ms.int32)",
    "type_as": lambda self, other: f"{self}.astype({other}.dtype)",
    "ne": _compare("!="), "eq": _compare("=="),
}
#: torch dtypes as the code of MindSpore's.
DTYPES = {"float32": "ms.float32", "float": "ms.float32", "float16": "ms.float16", "bfloat16": "ms.bfloat16",
          "float64": "ms.float64", "int64": "ms.int64", "long": "ms.int64", "int32": "ms.int32", "int": "ms.int32",
          "bool": "ms.bool_", "uint8": "ms.uint8", "int8": "ms.int8"}
