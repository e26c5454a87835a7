"""The operators of Hugging Face models as port writes them (trainkit.bridge.port.operators, with the attention
helper), run in MindSpore on seeded random shapes and compared with PyTorch computing the same call."""
import random

import mindspore as ms
import numpy as np
import pytest
from mindspore import ops

torch = pytest.importorskip("torch")

from trainkit.bridge.port.tables import FUNCTIONS, HELPERS, METHODS  # noqa: E402

CASES = 12  # per operator: seeded shapes, dims and factors


def run(code, **tensors):
    """The written code evaluated on MindSpore tensors of the PyTorch ones' values."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    names = {name: ms.Tensor(value.numpy()) if isinstance(value, torch.Tensor) else value
             for name, value in tensors.items()}
    return eval(code, {"ops": ops, "ms": ms, **names}).asnumpy()  # noqa: S307 - the code under test


def close(actual, expected):
    expected = expected.numpy()
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def shape(rng, rank):
    return [rng.randint(1, 5) for _ in range(rank)]


def test_gather_picks_along_a_dim_as_torch_gather_does():
    """BERT's token type ids: buffer.expand(...) gathered at the position ids."""
    rng = random.Random(0)
    for _ in range(CASES):
        size = shape(rng, rng.randint(1, 3))
        dim = rng.randrange(len(size))
        x = torch.randn(size)
        index = torch.randint(0, size[dim], [*size[:dim], rng.randint(1, 4), *size[dim + 1:]])
        close(run(FUNCTIONS["torch.gather"]("x", str(dim), "index"), x=x, index=index), torch.gather(x, dim, index))
        close(run(METHODS["gather"]("x", str(dim), "index"), x=x, index=index), x.gather(dim, index))


def test_addmm_and_baddbmm_with_their_factors_as_torch():
    """GPT-2's Conv1D is addmm(bias, x, weight)."""
    rng = random.Random(1)
    for _ in range(CASES):
        n, k, m, b = (rng.randint(1, 6) for _ in range(4))
        beta, alpha = rng.choice(["1", "0.5", "2"]), rng.choice(["1", "-1.5"])
        bias, mat1, mat2 = torch.randn(rng.choice([[m], [n, m]])), torch.randn(n, k), torch.randn(k, m)
        close(run(FUNCTIONS["torch.addmm"]("bias", "mat1", "mat2", beta=beta, alpha=alpha),
                  bias=bias, mat1=mat1, mat2=mat2), torch.addmm(bias, mat1, mat2, beta=float(beta), alpha=float(alpha)))
        scores, batch1, batch2 = torch.randn(b, n, m), torch.randn(b, n, k), torch.randn(b, k, m)
        close(run(FUNCTIONS["torch.baddbmm"]("scores", "batch1", "batch2", beta=beta, alpha=alpha),
                  scores=scores, batch1=batch1, batch2=batch2),
              torch.baddbmm(scores, batch1, batch2, beta=float(beta), alpha=float(alpha)))


def test_pow_where_masked_fill_and_cumsum_as_torch():
    rng = random.Random(2)
    for _ in range(CASES):
        size = shape(rng, rng.randint(1, 3))
        x, y = torch.randn(size), torch.randn(size)
        exponent = rng.choice([2.0, 3.0, 0.5])
        base = x.abs() + 0.1 if exponent == 0.5 else x
        close(run(FUNCTIONS["torch.pow"]("x", repr(exponent)), x=base), torch.pow(base, exponent))
        close(run(METHODS["pow"]("x", repr(exponent)), x=base), base.pow(exponent))
        condition = torch.rand(size) > 0.5
        close(run(FUNCTIONS["torch.where"]("c", "x", "y"), c=condition, x=x, y=y), torch.where(condition, x, y))
        close(run(METHODS["where"]("x", "c", "y"), c=condition, x=x, y=y), x.where(condition, y))
        close(run(METHODS["masked_fill"]("x", "c", "-10000.0"), c=condition, x=x), x.masked_fill(condition, -1e4))
        dim = rng.randrange(-len(size), len(size))
        close(run(FUNCTIONS["torch.cumsum"]("x", str(dim)), x=x), torch.cumsum(x, dim))
        # a bool mask's running count (GPT-2's packed sequences): int64 in PyTorch, said by the trace (port_trace)
        close(run(METHODS["cumsum"]("c", str(dim), dtype="ms.int64"), c=condition), condition.cumsum(dim))


def test_softmax_in_a_dtype_casts_first_as_torch_does():
    """Eager attention's softmax(scores, dim=-1, dtype=torch.float32) on half-precision scores."""
    rng = random.Random(3)
    for _ in range(CASES):
        size = shape(rng, rng.randint(1, 4))
        dim = rng.randrange(-len(size), len(size))
        x = (torch.randn(size) * 4).half()
        close(run(FUNCTIONS["torch.nn.functional.softmax"]("x", dim=str(dim), dtype="ms.float32"), x=x),
              torch.nn.functional.softmax(x, dim=dim, dtype=torch.float32))
        close(run(METHODS["softmax"]("x", str(dim)), x=x.float()), x.float().softmax(dim))


def test_transformers_gelu_activations_are_mindspore_gelu_layers_computing_theirs():
    """GPT-2's NewGELUActivation (the tanh formula with pow), GELUTanh, FastGELUActivation and BERT's
    GELUActivation as the nn.GELU port writes, against transformers' own modules. Mutation caught: the formula
    traced and written with ops.tanh, which MindSpore's CPU kernel computes up to 1e-4 off (1 + tanh(-5) < 0)."""
    from tests.common.torch_hf_models import transformers
    from trainkit.bridge.port.classes import CLASSES

    x = torch.linspace(-8, 8, 161)
    for name in ("NewGELUActivation", "GELUTanh", "FastGELUActivation", "GELUActivation"):
        module = getattr(transformers.activations, name)()
        call = CLASSES[f"transformers.activations.{name}"](module, None)
        layer = eval(f"{call.callee}(**{call.kwargs!r})", {"nn": ms.nn})  # noqa: S307 - the call port writes
        with torch.no_grad():
            expected = module(x)
        close(layer(ms.Tensor(x.numpy())).asnumpy(), expected)


def test_tanh_gelu_to_new_ones_and_argmax_as_torch():
    rng = random.Random(4)
    for _ in range(CASES):
        size = shape(rng, rng.randint(1, 3))
        x = torch.randn(size) * 3
        close(run(FUNCTIONS["torch.nn.functional.gelu"]("x", approximate="'tanh'"), x=x),
              torch.nn.functional.gelu(x, approximate="tanh"))
        close(run(METHODS["to"]("x", "ms.int32"), x=x), x.to(torch.int32))
        close(run(METHODS["to"]("x", "None"), x=x), x.to(None))  # a device: x itself
        close(run(METHODS["new_ones"]("x", repr(tuple(size))), x=x), x.new_ones(size))
        dim = rng.randrange(len(size))
        close(run(METHODS["argmax"]("x", str(dim)), x=x), x.argmax(dim))


def test_layer_norm_function_as_torch():
    """ConvNeXt's (transformers') channels-first LayerNorm calls F.layer_norm, with and without weights."""
    namespace = {"ops": ops, "ms": ms}
    exec(HELPERS["layer_norm"], namespace)  # noqa: S102 - the helper under test
    rng = random.Random(7)
    for _ in range(CASES):
        size = shape(rng, rng.randint(2, 4))
        normalized = tuple(size[-rng.randint(1, len(size) - 1):])
        x, weight, bias = torch.randn(size) * 3 + 1, torch.randn(normalized), torch.randn(normalized)
        eps = rng.choice([1e-5, 1e-6, 1e-12])
        affine = rng.random() < 0.7
        code = FUNCTIONS["torch.nn.functional.layer_norm"]("x", repr(normalized), *(("w", "b") if affine else ()),
                                                           eps=repr(eps))
        expected = torch.nn.functional.layer_norm(x, normalized, weight if affine else None,
                                                  bias if affine else None, eps)
        close(run(code, **namespace, x=x, w=weight, b=bias), expected)


@pytest.mark.parametrize("mask", ["bool", "additive"])
def test_attention_with_a_boolean_or_additive_mask_as_torch(mask):
    """transformers' masks from pad ids: a bool mask (sdpa) keeps where True; an additive one (eager) adds the
    dtype's minimum where masked."""
    namespace = {"ops": ops, "ms": ms}
    exec(HELPERS["scaled_dot_product_attention"], namespace)  # noqa: S102 - the helper under test
    rng = random.Random(5 if mask == "bool" else 6)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for _ in range(CASES):
        batch, heads, length, width = rng.randint(1, 3), rng.randint(1, 3), rng.randint(2, 6), rng.randint(1, 5)
        q, k, v = (torch.randn(batch, heads, length, width) for _ in range(3))
        keep = torch.ones(batch, 1, length, length, dtype=torch.bool)
        for row in range(batch):
            keep[row, :, :, rng.randint(1, length):] = False  # padding at the end, the first token kept
        lowest = torch.finfo(torch.float32).min
        attn_mask = keep if mask == "bool" else torch.zeros(keep.shape).masked_fill(~keep, lowest)
        scale = rng.choice([None, 0.3])
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        actual = namespace["scaled_dot_product_attention"](
            *(ms.Tensor(t.numpy()) for t in (q, k, v)), attn_mask=ms.Tensor(attn_mask.numpy()), scale=scale)
        close(actual.asnumpy(), expected)


def test_embedding_with_padding_idx_gives_the_pad_row_no_gradient_as_torch():
    """BERT's word embeddings have padding_idx=0: PyTorch leaves that row's gradient zero, so fine-tuning never
    moves the pad vector; the ported Embedding computes the same vectors and the same gradient. Mutation caught:
    padding_idx dropped (the pad row's gradient is the sum over the pads)."""
    from trainkit.bridge.port.layers import layer_call

    rng = random.Random(8)
    for _ in range(4):
        count, width = rng.randint(3, 9), rng.randint(1, 5)
        padding = rng.choice([0, count - 1, -1])
        module = torch.nn.Embedding(count, width, padding_idx=padding)
        call = layer_call(module)
        namespace = {"ops": ops, "ms": ms, "nn": ms.nn, "Parameter": ms.Parameter,
                     "initializer": ms.common.initializer.initializer, "Normal": ms.common.initializer.Normal}
        exec(HELPERS["Embedding"], namespace)  # noqa: S102 - the helper under test
        layer = namespace["Embedding"](**call.kwargs)
        layer.weight.set_data(ms.Tensor(module.weight.detach().numpy()))
        ids = torch.randint(0, count, (2, 6))
        ids[0, :2] = module.padding_idx  # pads for sure
        upstream = torch.randn(2, 6, width)
        vectors = module(ids)
        (vectors * upstream).sum().backward()
        ms.set_context(mode=ms.PYNATIVE_MODE)
        up = ms.Tensor(upstream.numpy())
        gradient = ms.grad(lambda t, layer=layer, up=up: (layer(t) * up).sum(), grad_position=None,
                           weights=layer.trainable_params())(ms.Tensor(ids.numpy()))[0]
        close(layer(ms.Tensor(ids.numpy())).asnumpy(), vectors.detach())
        close(gradient.asnumpy(), module.weight.grad)
        assert not module.weight.grad[module.padding_idx].any()


def test_filled_tensors_extrema_and_unary_functions_as_torch():
    """MobileBERT's torch.zeros(input_shape, dtype=long), MPNet's relative position buckets (abs, log, full_like,
    torch.min), Bloom's alibi.baddbmm: seeded shapes, dtypes and values, against PyTorch's own calls."""
    rng = random.Random(3)
    dtypes = [("None", None), ("ms.int64", torch.int64), ("ms.float32", torch.float32), ("ms.bool_", torch.bool)]
    for _ in range(CASES):
        size = shape(rng, rng.randint(1, 3))
        code, dtype = rng.choice(dtypes)
        keywords = {} if dtype is None else {"dtype": dtype}
        close(run(FUNCTIONS["torch.zeros"](repr(tuple(size)), dtype=code)), torch.zeros(size, **keywords))
        close(run(FUNCTIONS["torch.ones"](*map(str, size), dtype=code)), torch.ones(*size, **keywords))
        value = rng.choice(["3", "-1.5", "True"])
        filled = {"3": 3, "-1.5": -1.5, "True": True}[value]
        close(run(FUNCTIONS["torch.full"](repr(tuple(size)), value)), torch.full(size, filled))
        x, y = torch.randn(size), torch.randn(size)
        close(run(FUNCTIONS["torch.zeros_like"]("x", dtype=code), x=x), torch.zeros_like(x, **keywords))
        close(run(FUNCTIONS["torch.ones_like"]("x"), x=x), torch.ones_like(x))
        close(run(FUNCTIONS["torch.full_like"]("x", value, dtype=code), x=x), torch.full_like(x, filled, **keywords))
        close(run(FUNCTIONS["torch.min"]("x", "y"), x=x, y=y), torch.min(x, y))
        close(run(FUNCTIONS["torch.max"]("x", "y"), x=x, y=y), torch.max(x, y))
        for name in ("abs", "exp"):
            close(run(FUNCTIONS[f"torch.{name}"]("x"), x=x), getattr(torch, name)(x))
            close(run(METHODS[name]("x"), x=x), getattr(x, name)())
        positive = x.abs() + 0.1
        for name in ("log", "sqrt", "rsqrt"):
            close(run(FUNCTIONS[f"torch.{name}"]("x"), x=positive), getattr(torch, name)(positive))
        b, n, k, m = (rng.randint(1, 4) for _ in range(4))
        bias, batch1, batch2 = torch.randn(b, n, m), torch.randn(b, n, k), torch.randn(b, k, m)
        close(run(METHODS["baddbmm"]("bias", "batch1", "batch2", beta="1.0", alpha="0.5"), bias=bias, batch1=batch1,
                  batch2=batch2), bias.baddbmm(batch1, batch2, beta=1.0, alpha=0.5))


def test_a_reduction_by_torch_min_and_a_computed_fill_without_dtype_are_refused():
    from trainkit.bridge.port.layers import Unsupported

    for call in (lambda: FUNCTIONS["torch.min"]("x", "1"), lambda: FUNCTIONS["torch.max"]("x"),
                 lambda: FUNCTIONS["torch.full"]("(2, 3)", "value")):
        with pytest.raises(Unsupported):
            call()
