"""The functions port writes for torchvision's Swin (trainkit.bridge.port.windows), run in MindSpore and compared with
PyTorch computing the same call."""
import random

import mindspore as ms
import numpy as np
import pytest
from mindspore import ops

torch = pytest.importorskip("torch")

from trainkit.bridge.port.windows import FUNCTIONS, HELPERS  # noqa: E402


def helpers(*names):
    """The helpers' source run as the generated module runs it: a namespace with their functions."""
    namespace = {"ops": ops, "ms": ms}
    for name in names:
        exec(HELPERS[name], namespace)  # noqa: S102 - the code under test, as port writes it into model.py
    return namespace


def test_pad_is_torch_pad_forward_and_backward_with_crops_and_fill_values():
    """F.pad's constant mode as port writes it (concatenations and narrows, not PadV3, whose gradient writes out of
    bounds on CPU): on seeded shapes, paddings of one to all axes, negative (a crop), zero and positive, and fill
    values, the values and the input's gradient are torch's. Mutation caught: the blocks on the wrong side, the
    axes taken first-to-last, a crop from the wrong end."""
    pad = helpers("pad")["pad"]
    rng = random.Random(0)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for _ in range(100):
        shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
        padding = []
        for axis in range(rng.randint(1, len(shape))):
            size = shape[len(shape) - 1 - axis]
            before = rng.randint(-(size - 1) // 2, 3)
            after = rng.randint(-(size - 1 + min(before, 0)), 3)
            padding += [before, after]
        value = rng.choice([None, 0.0, -100.0, 1.5])
        x = torch.randn(shape, requires_grad=True)
        expected = torch.nn.functional.pad(x, padding, value=0.0 if value is None else value)
        weights = torch.randn(expected.shape)
        (expected * weights).sum().backward()

        ms_weights = ms.Tensor(weights.numpy())

        def weighted(t, padding=tuple(padding), value=value, weights=ms_weights):
            return (pad(t, padding, value=value) * weights).sum()

        actual = pad(ms.Tensor(x.detach().numpy()), tuple(padding), value=value)
        np.testing.assert_allclose(actual.asnumpy(), expected.detach().numpy(), rtol=0, atol=0)
        gradient = ms.grad(weighted)(ms.Tensor(x.detach().numpy())).asnumpy()
        np.testing.assert_allclose(gradient, x.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_pad_written_for_f_pad_keeps_other_modes_and_names_only_what_differs():
    assert FUNCTIONS["torch.nn.functional.pad"]("x", "(0, 1)") == "pad(x, (0, 1))"
    assert FUNCTIONS["torch.nn.functional.pad"]("x", "(0, 1)", "'reflect'") == "pad(x, (0, 1), mode='reflect')"
    assert FUNCTIONS["torch.nn.functional.pad"]("x", "(0, 1)", value="2.0") == "pad(x, (0, 1), value=2.0)"
    ms.set_context(mode=ms.PYNATIVE_MODE)
    reflect = helpers("pad")["pad"](ms.Tensor(np.arange(4, dtype=np.float32).reshape(1, 1, 4)), (1, 2), "reflect")
    np.testing.assert_array_equal(reflect.asnumpy(), np.pad(np.arange(4.0).reshape(1, 1, 4), ((0, 0), (0, 0), (1, 2)),
                                                           mode="reflect"))
