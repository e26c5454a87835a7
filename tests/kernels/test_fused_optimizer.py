"""The fused optimizer updates (trainkit/step/fused_optimizer.py, kernels in trainkit/kernels/fused.cc): SGD with
momentum bitwise ``nn.Momentum``; Adam and AdamWeightDecay bitwise NumPy's float32 arithmetic written here (and
within a float32 rounding of MindSpore's); a non-finite step moves nothing. Graph and pynative mode."""

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from tests.common.kernels import needs_compiler
from trainkit.step.fused_optimizer import fused_optimizer_update

pytestmark = needs_compiler
f32 = np.float32
# Around the threads' split (256 Ki values): it falls inside a tensor; "gamma" is not decayed by MindSpore's filter.
SHAPES = {"w0": (3, 4), "w1": (300_001,), "gamma": (7,), "w3": (2, 100_000), "w4": (1,)}
RATES = [0.1, 0.05, 0.02, 0.01, 0.005]  # one per step: the schedule follows global_step
FACTOR = f32(0.37)  # the wrapper's unscale x clip factor


def initial() -> dict:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape).astype(f32) for name, shape in SHAPES.items()}


def make_optimizer(kind: str, tag: str):
    params = [Parameter(Tensor(value), name=f"{tag}.{name}") for name, value in initial().items()]
    if kind == "momentum":
        return nn.Momentum(params, RATES, 0.9, weight_decay=0.01)
    if kind == "adam":
        return nn.Adam(params, RATES, weight_decay=0.01)
    return nn.AdamWeightDecay(params, RATES, weight_decay=0.01)


class MindSporeStep(nn.Cell):
    """The path the fused one replaces: ``optimizer(grads * factor)``."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer

    def construct(self, grads, factor):
        return self.optimizer(tuple(grad * factor for grad in grads))


class FusedStep(nn.Cell):
    def __init__(self, optimizer):
        super().__init__()
        self.update = fused_optimizer_update(optimizer)

    def construct(self, grads, factor, finite):
        return self.update(grads, factor, finite)


def gradients(steps: int):
    rng = np.random.default_rng(1)
    return [{name: rng.standard_normal(shape).astype(f32) for name, shape in SHAPES.items()} for _ in range(steps)]


def numpy_adam(kind: str, steps: list) -> dict:
    """nn.Adam (L2 decay into the gradient, bias-corrected rate) or nn.AdamWeightDecay (decoupled decay, no bias
    correction), written from their documentation, float32 operation by operation."""
    one, beta1, beta2 = f32(1), f32(0.9), f32(0.999)
    eps = f32(1e-8) if kind == "adam" else f32(1e-6)
    weights = initial()
    m = {name: np.zeros(shape, f32) for name, shape in SHAPES.items()}
    v = {name: np.zeros(shape, f32) for name, shape in SHAPES.items()}
    power1 = power2 = one
    for step, grads in enumerate(steps):
        lr = f32(RATES[step])
        power1, power2 = power1 * beta1, power2 * beta2
        for name, grad in grads.items():
            g = grad * FACTOR
            decay = f32(0.01) if name != "gamma" else f32(0)
            if kind == "adam":
                if decay:
                    g = weights[name] * decay + g
                m[name] = m[name] + (g - m[name]) * (one - beta1)
                v[name] = v[name] + (g * g - v[name]) * (one - beta2)
                rate = lr * np.sqrt(one - power2) / (one - power1)
                weights[name] = weights[name] - rate * m[name] / (np.sqrt(v[name]) + eps)
            else:
                m[name] = beta1 * m[name] + (one - beta1) * g
                v[name] = beta2 * v[name] + (one - beta2) * (g * g)
                update = m[name] / (np.sqrt(v[name]) + eps)
                if decay:
                    update = update + decay * weights[name]
                weights[name] = weights[name] - lr * update
    return {"weights": weights, "m": m, "v": v, "powers": (power1, power2)}


def state(optimizer) -> dict:
    """Every Parameter of `optimizer` by its name without the a./b. tag and the prefix of the Cell holding it."""
    def short(name: str) -> str:
        parts = name.split(".")
        parts = parts[1:] if parts[0] in ("optimizer", "update") else parts
        return ".".join(part for part in parts if part not in ("a", "b"))

    return {short(p.name): p.asnumpy().copy() for p in optimizer.get_parameters()}


def fused_and_reference(kind: str, steps: list):
    reference, fused = make_optimizer(kind, "a"), make_optimizer(kind, "b")
    reference_step, fused_step = MindSporeStep(reference), FusedStep(fused)
    for grads in steps:
        values = tuple(Tensor(grad) for grad in grads.values())
        reference_step(values, Tensor(FACTOR))
        fused_step(values, Tensor(FACTOR), Tensor(True))
    return state(reference), state(fused), fused


def test_momentum_is_bitwise_nn_momentum(mode, shared_cache):
    """Mutations caught: the kernel without its weight decay line; without ``* factor``."""
    reference, fused, _ = fused_and_reference("momentum", gradients(len(RATES)))
    assert reference.keys() == fused.keys() and any(name.startswith("moments.") for name in fused)
    for name, value in reference.items():
        np.testing.assert_array_equal(fused[name], value, err_msg=name)
    assert fused["global_step"].tolist() == [len(RATES)]


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_is_bitwise_numpys_float32_arithmetic_and_within_a_rounding_of_mindspores(mode, shared_cache, kind):
    """Moments, bias correction and weight decay as NumPy computes them here, bit for bit; MindSpore's own
    (SIMD) kernels differ from that in the last bit of a few values, so they are compared within 1e-6.
    Mutation caught: Adam's bias correction from the beta powers before this step's multiply."""
    steps = gradients(len(RATES))
    reference, fused, optimizer = fused_and_reference(kind, steps)
    expected = numpy_adam(kind, steps)
    first, second = ("moment1.", "moment2.") if kind == "adam" else ("adam_m.", "adam_v.")
    for name in SHAPES:
        np.testing.assert_array_equal(fused[name], expected["weights"][name], err_msg=name)
        np.testing.assert_array_equal(fused[first + name], expected["m"][name], err_msg=first + name)
        np.testing.assert_array_equal(fused[second + name], expected["v"][name], err_msg=second + name)
        np.testing.assert_allclose(fused[name], reference[name], rtol=1e-6, atol=1e-6, err_msg=name)
    if kind == "adam":
        assert (fused["beta1_power"], fused["beta2_power"]) == expected["powers"]
        assert (fused["beta1_power"], fused["beta2_power"]) == (reference["beta1_power"], reference["beta2_power"])
    assert fused["global_step"].tolist() == reference["global_step"].tolist() == [len(RATES)]


@pytest.mark.parametrize("kind", ["momentum", "adam", "adamw"])
def test_a_nonfinite_step_moves_no_weight_moment_power_or_step(mode, shared_cache, kind):
    """A skipped step between two good ones: nothing moved by it, and the run goes on as if it never came (the
    schedule's next rate included). Mutation caught: the kernel without its finite check (and with it, the step
    counter moved on a skipped step)."""
    steps = gradients(3)
    optimizer = make_optimizer(kind, "b")
    fused_step = FusedStep(optimizer)
    fused_step(tuple(Tensor(g) for g in steps[0].values()), Tensor(FACTOR), Tensor(True))
    before = state(optimizer)
    poisoned = tuple(Tensor(np.full(shape, np.nan, f32)) for shape in SHAPES.values())
    fused_step(poisoned, Tensor(FACTOR), Tensor(False))
    after = state(optimizer)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    for grads in steps[1:]:
        fused_step(tuple(Tensor(g) for g in grads.values()), Tensor(FACTOR), Tensor(True))
    # The same two good steps without the skipped one in between, on MindSpore's optimizer.
    reference = make_optimizer(kind, "a")
    reference_step = MindSporeStep(reference)
    for grads in (steps[0], *steps[1:]):
        reference_step(tuple(Tensor(g) for g in grads.values()), Tensor(FACTOR))
    expected, got = state(reference), state(optimizer)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert got["global_step"].tolist() == [3]


def test_optimizers_it_does_not_repeat_stay_on_mindspores_kernels(shared_cache, graph_mode):
    """The decision in Python (__init__): None for what the kernels do not do, so MindSpore's runs."""
    def params():
        return [Parameter(Tensor(np.ones(3, f32)), name="w")]

    assert fused_optimizer_update(nn.Momentum(params(), 0.1, 0.9)) is not None
    assert fused_optimizer_update(nn.Momentum(params(), 0.1, 0.9, use_nesterov=True)) is None
    assert fused_optimizer_update(nn.Adam(params(), 0.1, use_amsgrad=True)) is None
    assert fused_optimizer_update(nn.Momentum(params(), 0.1, 0.9, loss_scale=2.0)) is None
    assert fused_optimizer_update(nn.SGD(params(), 0.1)) is None
    grouped = params()
    assert fused_optimizer_update(nn.Adam([{"params": grouped, "lr": 0.5}], 0.1)) is None
    half = [Parameter(Tensor(np.ones(3, np.float16)), name="h")]
    assert fused_optimizer_update(nn.Momentum(half, 0.1, 0.9)) is None
