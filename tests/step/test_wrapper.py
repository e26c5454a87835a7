"""TrainingWrapper against independent NumPy arithmetic (tests/common/reference.py)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import amp, nn

from tests.common.models import TinyMLP, batches, initial_weights, loss_network, run, weights_of
from tests.common.reference import Adam, ReferenceTrainer, SGDMomentum, mlp_loss_and_grads
from trainkit import TrainingWrapper

TOL = dict(rtol=1e-4, atol=1e-5)
WEIGHTS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def make(optimizer="momentum", lr=0.1, **wrapper_kwargs):
    net = TinyMLP()
    if optimizer == "momentum":
        opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    elif optimizer == "sgd":
        opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    else:
        opt = nn.Adam(net.trainable_params(), learning_rate=lr)
    return net, opt, TrainingWrapper(loss_network(net), opt, **wrapper_kwargs)


def reference_optimizer(optimizer, lr=0.1):
    return {"momentum": SGDMomentum(lr, 0.9), "sgd": SGDMomentum(lr, 0.0), "adam": Adam(lr)}[optimizer]


def assert_weights(net, params, **tol):
    got = weights_of(net)
    for name in WEIGHTS:
        np.testing.assert_allclose(got[name], params[name], err_msg=name, **(tol or TOL))


@pytest.mark.parametrize("optimizer,skip_nonfinite", [("momentum", False), ("adam", False), ("sgd", True)])
def test_accumulated_micro_batches_equal_one_big_batch(mode, optimizer, skip_nonfinite):
    """The window's mean gradient applied once, against NumPy; ``nn.SGD`` (which the fused step does not repeat)
    with the guard on: MindSpore's optimizer behind the window's and the guard's branches."""
    k, micro = 4, 2
    data = batches(3 * k, micro)
    net, opt, wrapper = make(optimizer, lr=0.05, accumulation_steps=k, skip_nonfinite=skip_nonfinite)
    ref_params = {n: v.astype(np.float64) for n, v in initial_weights().items()}
    ref_opt = reference_optimizer(optimizer, 0.05)
    before = weights_of(net)
    wrapper.set_train()
    for window in range(3):
        chunk = data[window * k:(window + 1) * k]
        for i, (x, y) in enumerate(chunk):
            run(wrapper, [(x, y)])
            if i < k - 1:  # nothing moves inside the window
                for name in WEIGHTS:
                    np.testing.assert_array_equal(weights_of(net)[name], before[name])
        big_x = np.concatenate([x for x, _ in chunk])
        big_y = np.concatenate([y for _, y in chunk])
        _, grads = mlp_loss_and_grads(ref_params, big_x, big_y)
        # Never cleared: the next window's first micro-step overwrites it. The window with no branch (trainkit's
        # kernels) adds the last micro-batch in too; the branch hands _grad_sum + g on without writing it back.
        summed = chunk if wrapper.accumulate_all is not None else chunk[:-1]
        held = sum(mlp_loss_and_grads(ref_params, x, y)[1]["fc1.weight"] for x, y in summed) / k
        ref_opt.step(ref_params, grads)
        assert_weights(net, ref_params)
        np.testing.assert_allclose(wrapper._grad_sum[0].asnumpy(), held, **TOL)
        before = weights_of(net)
    assert int(opt.global_step.asnumpy()) == 3  # one optimizer (and LR schedule) step per window


def test_first_output_is_unscaled_micro_batch_loss(mode):
    data = batches(4, 3)
    _, _, wrapper = make(loss_scale=256.0, accumulation_steps=2)
    outputs = run(wrapper, data[:1])
    expected, _ = mlp_loss_and_grads({n: v.astype(np.float64) for n, v in initial_weights().items()}, *data[0])
    np.testing.assert_allclose(outputs[0][0], expected, rtol=1e-5)


@pytest.mark.parametrize("max_norm", [0.05, 100.0], ids=["above", "below"])
def test_clipping_of_the_accumulated_gradient(mode, max_norm):
    """SGD with lr 1: the applied update is the clipped gradient itself."""
    k = 2
    data = batches(k, 3, seed=5)
    net, _, wrapper = make("sgd", lr=1.0, accumulation_steps=k, max_grad_norm=max_norm)
    start = {n: v.astype(np.float64) for n, v in initial_weights().items()}
    raw = {n: 0.0 for n in WEIGHTS}
    for x, y in data:
        _, g = mlp_loss_and_grads(start, x, y)
        raw = {n: raw[n] + g[n] / k for n in WEIGHTS}
    raw_norm = np.sqrt(sum(np.sum(g ** 2) for g in raw.values()))
    outputs = run(wrapper, data)
    np.testing.assert_allclose(outputs[-1][3], raw_norm, rtol=1e-5)  # norm before clipping
    applied = {n: start[n] - weights_of(net)[n] for n in WEIGHTS}
    applied_norm = np.sqrt(sum(np.sum(g ** 2) for g in applied.values()))
    if raw_norm > max_norm:
        np.testing.assert_allclose(applied_norm, max_norm, rtol=1e-4)
        for n in WEIGHTS:  # same direction
            np.testing.assert_allclose(applied[n], raw[n] * max_norm / raw_norm, rtol=1e-3, atol=1e-6)
    else:
        for n in WEIGHTS:
            np.testing.assert_allclose(applied[n], raw[n], rtol=1e-4, atol=1e-7)
    assert max_norm == 100.0 or raw_norm > 10 * max_norm  # the "above" case really clips


def test_dynamic_loss_scale_skips_exactly_the_window_and_backs_off(mode):
    k, window = 2, 2
    data = batches(6 * k, 3, seed=7)
    data[3][0][0, 0] = np.nan  # second micro-batch of the second window
    net, opt, wrapper = make(
        "momentum", accumulation_steps=k, loss_scale=amp.DynamicLossScaler(2.0 ** 10, 2, window))
    ref = ReferenceTrainer(initial_weights(), SGDMomentum(0.1, 0.9), accumulation_steps=k,
                           loss_scale=2.0 ** 10, scale_factor=2, scale_window=window)
    before_window_2 = None
    outputs = []
    for i, (x, y) in enumerate(data):
        if i == 2:
            before_window_2 = weights_of(net)
        outputs += run(wrapper, [(x, y)])
        ref.micro_step(x, y)
        if i == 3:
            for name in WEIGHTS:  # the planted window left the weights exactly as they were
                np.testing.assert_array_equal(weights_of(net)[name], before_window_2[name])
            assert int(opt.global_step.asnumpy()) == 1
    assert [bool(o[1]) for o in outputs] == ref.overflows
    assert ref.overflows == [False, False, False, True] + [False] * 8
    np.testing.assert_array_equal([float(o[2]) for o in outputs], ref.scales_used)
    # 1024 -> back-off to 512 after the bad window -> grows back to 1024 after `window` good windows
    assert ref.scales_used == [1024.0] * 4 + [512.0] * 4 + [1024.0] * 4
    assert float(wrapper.loss_scale_value.asnumpy()) == ref.scale
    assert int(opt.global_step.asnumpy()) == ref.optimizer_steps == 5
    assert_weights(net, ref.params)


def test_static_loss_scale_skips_non_finite_step(mode):
    data = batches(3, 3, seed=8)
    data[1][0][0, 0] = np.inf
    net, opt, wrapper = make("sgd", loss_scale=128)
    ref = ReferenceTrainer(initial_weights(), SGDMomentum(0.1, 0.0), loss_scale=128.0)
    outputs = run(wrapper, data)
    for x, y in data:
        ref.micro_step(x, y)
    assert [bool(o[1]) for o in outputs] == [False, True, False]
    assert [float(o[2]) for o in outputs] == [128.0] * 3
    assert int(opt.global_step.asnumpy()) == 2
    assert_weights(net, ref.params)


ALL_FEATURES = dict(accumulation_steps=3, max_grad_norm=0.3, ema_decay=0.8)


def train_all_features(data):
    net, opt, wrapper = make("adam", lr=0.05, loss_scale=amp.DynamicLossScaler(2.0 ** 8, 2, 2), **ALL_FEATURES)
    return net, opt, wrapper, run(wrapper, data)


def all_features_data():
    data = batches(5 * 3, 2, seed=11)
    data[4][0][1, 2] = np.nan  # second window is skipped
    return data


def test_all_features_together_match_reference(mode):
    data = all_features_data()
    net, opt, wrapper, outputs = train_all_features(data)
    ref = ReferenceTrainer(initial_weights(), Adam(0.05), loss_scale=2.0 ** 8, scale_factor=2, scale_window=2,
                           **ALL_FEATURES)
    for x, y in data:
        ref.micro_step(x, y)
    assert [bool(o[1]) for o in outputs] == ref.overflows
    assert [float(o[2]) for o in outputs] == ref.scales_used
    ends = [i for i in range(len(data)) if (i + 1) % 3 == 0 and not ref.overflows[i]]
    np.testing.assert_allclose([outputs[i][3] for i in ends], [ref.grad_norms[i] for i in ends], rtol=1e-4)
    assert_weights(net, ref.params)
    got = {p.name: p.asnumpy() for p in wrapper.get_parameters()}
    for name in WEIGHTS:
        np.testing.assert_allclose(got["ema." + name], ref.ema[name], **TOL)
    assert int(opt.global_step.asnumpy()) == ref.optimizer_steps == 4


def test_graph_and_pynative_give_the_same_state():
    data = all_features_data()
    states = {}
    for name, mode in (("graph", ms.GRAPH_MODE), ("pynative", ms.PYNATIVE_MODE)):
        ms.set_context(mode=mode)
        _, _, wrapper, _ = train_all_features(data)
        states[name] = {p.name: p.asnumpy() for p in wrapper.get_parameters()}
    ms.set_context(mode=ms.GRAPH_MODE)
    assert states["graph"].keys() == states["pynative"].keys()
    for key, value in states["graph"].items():
        np.testing.assert_allclose(value, states["pynative"][key], rtol=1e-6, atol=1e-7, err_msg=key)


class HalvedGradients(TrainingWrapper):
    """A user's subclass: a custom gradient transform before the built-in clipping."""

    def transform_grads(self, grads):
        grads = self.hyper_map(lambda g: g * 0.5, grads)
        return super().transform_grads(grads)


def test_subclass_with_custom_gradient_transform_trains_in_graph_mode(graph_mode):
    data = batches(4, 3, seed=13)
    net = TinyMLP()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    wrapper = HalvedGradients(loss_network(net), opt, max_grad_norm=0.2)
    ref = ReferenceTrainer(initial_weights(), SGDMomentum(0.1, 0.9), max_grad_norm=0.2,
                           grad_transform=lambda g: {k: v * 0.5 for k, v in g.items()})
    outputs = run(wrapper, data)
    for x, y in data:
        ref.micro_step(x, y)
    np.testing.assert_allclose([o[3] for o in outputs], ref.grad_norms, rtol=1e-4)
    assert_weights(net, ref.params)


def test_gradients_follow_grouped_optimizer_parameters(mode):
    """Groups in another order than the network's, and a frozen weight: updates stay aligned."""
    net = TinyMLP()
    params = {p.name: p for p in net.trainable_params()}
    groups = [{"params": [params["fc2.bias"], params["fc1.bias"]], "lr": 0.05},
              {"params": [params["fc2.weight"]], "lr": 0.2}]  # fc1.weight is frozen (not in the optimizer)
    opt = nn.Momentum(groups, learning_rate=0.1, momentum=0.0)
    wrapper = TrainingWrapper(loss_network(net), opt, accumulation_steps=2, max_grad_norm=10.0)
    data = batches(4, 3, seed=17)
    run(wrapper, data)
    ref = {n: v.astype(np.float64) for n, v in initial_weights().items()}
    lrs = {"fc2.bias": 0.05, "fc1.bias": 0.05, "fc2.weight": 0.2}
    for window in (data[:2], data[2:]):
        grads = [mlp_loss_and_grads(ref, x, y)[1] for x, y in window]
        for name, lr in lrs.items():
            ref[name] = ref[name] - lr * (grads[0][name] + grads[1][name]) / 2
    assert_weights(net, ref)


def test_features_off_add_no_state_over_train_one_step_cell():
    """Free when off: the same Parameters as nn.TrainOneStepCell, and constant extra outputs."""
    net = TinyMLP()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.1)
    baseline = nn.TrainOneStepCell(loss_network(net), opt)
    wrapper = TrainingWrapper(loss_network(net), opt)
    assert sorted(p.name for p in wrapper.get_parameters()) == sorted(p.name for p in baseline.get_parameters())
    assert wrapper.ema is None and wrapper.grad_reducer is None and wrapper.loss_scaler is None
    outputs = run(wrapper, batches(2, 3))
    assert [(bool(o[1]), float(o[2]), float(o[3])) for o in outputs] == [(False, 1.0, 0.0)] * 2


class OutputsSeenByCallbacks(ms.train.Callback):
    def __init__(self):
        super().__init__()
        self.outputs = []

    def on_train_step_end(self, run_context):
        self.outputs.append(tuple(o.asnumpy() for o in run_context.original_args().net_outputs))


@pytest.mark.parametrize("sink", [False, True], ids=["no-sink", "sink"])
def test_trains_under_model_train(graph_mode, sink):
    """mindspore.train.Model drives the wrapper, in dataset sink mode too."""
    k = 2
    data = batches(4 * k, 3, seed=19)
    dataset = ms.dataset.NumpySlicesDataset(
        {"x": np.stack([x for x, _ in data]), "y": np.stack([y for _, y in data])}, shuffle=False)
    net, opt, wrapper = make("adam", lr=0.05, accumulation_steps=k, ema_decay=0.5,
                             loss_scale=amp.DynamicLossScaler(2.0 ** 8, 2, 3))
    seen = OutputsSeenByCallbacks()
    ms.train.Model(wrapper).train(2, dataset, callbacks=[seen], dataset_sink_mode=sink)
    ref = ReferenceTrainer(initial_weights(), Adam(0.05), accumulation_steps=k, ema_decay=0.5,
                           loss_scale=2.0 ** 8, scale_factor=2, scale_window=3)
    for _ in range(2):
        for x, y in data:
            ref.micro_step(x, y)
    assert_weights(net, ref.params)
    assert float(wrapper.loss_scale_value.asnumpy()) == ref.scale == 2.0 ** 10
    if not sink:  # a callback sees every call's (loss, overflow, loss_scale, grad_norm)
        assert [len(o) for o in seen.outputs] == [4] * len(ref.scales_used)
        assert [float(o[2]) for o in seen.outputs] == ref.scales_used
        assert [bool(o[1]) for o in seen.outputs] == ref.overflows
    np.testing.assert_allclose(wrapper.parameters_dict()["ema.fc2.weight"].asnumpy(), ref.ema["fc2.weight"], **TOL)


def test_grad_norm_covers_parameters_of_every_rank(mode):
    """Conv (4-D), dense (2-D) and bias/BN (1-D) gradients all enter the reported global norm."""
    ms.set_seed(1)
    net = nn.SequentialCell(nn.Conv2d(2, 3, 3, has_bias=True), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                            nn.Dense(3 * 4 * 4, 2))
    loss_net = loss_network(net)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.0)
    rng = np.random.RandomState(2)
    x = ms.Tensor(rng.randn(2, 2, 4, 4).astype(np.float32))
    y = ms.Tensor(np.array([0, 1], np.int32))
    loss_net.set_train()  # batch statistics, as in training
    grads = ms.value_and_grad(loss_net, None, opt.parameters)(x, y)[1]  # MindSpore autodiff, no wrapper
    expected = np.sqrt(sum(np.sum(g.asnumpy().astype(np.float64) ** 2) for g in grads))
    assert {g.ndim for g in grads} == {1, 2, 4}
    wrapper = TrainingWrapper(loss_net, opt, compute_grad_norm=True)
    wrapper.set_train()
    np.testing.assert_allclose(wrapper(x, y)[3].asnumpy(), expected, rtol=1e-5)


def test_learning_rate_schedule_advances_once_per_applied_window(mode):
    """A per-step LR list is indexed by applied optimizer steps: not by micro-batches, not by skipped windows."""
    k = 2
    schedule = [0.5, 0.2, 0.1, 0.05]
    net = TinyMLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=schedule)
    wrapper = TrainingWrapper(loss_network(net), opt, accumulation_steps=k, loss_scale=4)
    data = batches(4 * k, 3, seed=29)
    data[2][0][1, 1] = np.inf  # the second window is skipped
    run(wrapper, data)
    ref = {n: v.astype(np.float64) for n, v in initial_weights().items()}
    applied = 0
    for window in range(4):
        micro = data[window * k:(window + 1) * k]
        if any(not np.all(np.isfinite(x)) for x, _ in micro):
            continue
        grads = [mlp_loss_and_grads(ref, x, y)[1] for x, y in micro]
        for name in WEIGHTS:
            ref[name] = ref[name] - schedule[applied] * sum(g[name] for g in grads) / k
        applied += 1
    assert applied == 3 and int(opt.global_step.asnumpy().item()) == 3
    assert_weights(net, ref)
