"""EMA shadows follow ema = d * ema + (1 - d) * w after each applied step, batch-norm statistics included."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.common.models import TinyMLP, batches, loss_network, run, weights_of
from trainkit import TrainingWrapper


@pytest.mark.parametrize("accumulation_steps,warmup", [(1, False), (2, True)])
def test_shadows_follow_the_formula_including_batch_norm_statistics(mode, accumulation_steps, warmup):
    decay = 0.7
    net = TinyMLP(batch_norm=True)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    wrapper = TrainingWrapper(loss_network(net), opt, ema_decay=decay, ema_warmup=warmup,
                              accumulation_steps=accumulation_steps)
    expected = weights_of(net)  # shadows start as the initial weights
    assert {"bn.moving_mean", "bn.moving_variance", "bn.gamma", "fc1.weight"} <= expected.keys()
    updates = 0
    for step, batch in enumerate(batches(4 * accumulation_steps, 4, seed=3)):
        run(wrapper, [batch])
        if (step + 1) % accumulation_steps:
            continue
        d = min(decay, (1 + updates) / (10 + updates)) if warmup else decay
        current = weights_of(net)
        expected = {k: d * expected[k] + (1 - d) * current[k] for k in expected}
        updates += 1
    shadows = {p.name: p.asnumpy() for p in wrapper.get_parameters() if p.name.startswith("ema.")}
    assert shadows.keys() == {"ema." + k for k in expected}
    for name, value in expected.items():
        np.testing.assert_allclose(shadows["ema." + name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # the moving statistics really moved, so the test covers them
    assert not np.allclose(weights_of(net)["bn.moving_mean"], 0)
    assert int(wrapper.ema.num_updates.asnumpy()) == updates


def test_shadows_are_saved_in_the_wrapper_checkpoint(tmp_path, graph_mode):
    net = TinyMLP(batch_norm=True)
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    wrapper = TrainingWrapper(loss_network(net), opt, ema_decay=0.9, accumulation_steps=2,
                              loss_scale=ms.amp.DynamicLossScaler(16, 2, 10))
    run(wrapper, batches(2, 4))
    path = str(tmp_path / "wrapper.ckpt")
    ms.save_checkpoint(wrapper, path)
    saved = ms.load_checkpoint(path)
    for name in ("fc1.weight", "bn.moving_mean", "bn.moving_variance"):
        assert "ema." + name in saved
        np.testing.assert_array_equal(saved["ema." + name].asnumpy(),
                                      wrapper.parameters_dict()["ema." + name].asnumpy())
    # everything a resume needs is a Parameter of the wrapper
    for name in ("ema_num_updates", "loss_scale.scale_value", "loss_scale.counter", "micro_step",
                 "_grad_sum.fc1.weight", "moment1.fc1.weight", "global_step"):
        assert name in saved, name


def test_shadow_weights_load_into_the_bare_network(graph_mode):
    net = TinyMLP(batch_norm=True)
    wrapper = TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), 0.5), ema_decay=0.5)
    run(wrapper, batches(3, 4))
    fresh = TinyMLP(batch_norm=True, seed=9)
    not_loaded, _ = ms.load_param_into_net(fresh, wrapper.ema.shadow_weights(), strict_load=True)
    assert not not_loaded
    for name, value in weights_of(fresh).items():
        np.testing.assert_array_equal(value, wrapper.parameters_dict()["ema." + name].asnumpy())
        assert not np.array_equal(value, weights_of(net)[name]), name  # shadows, not the live weights


def test_evaluating_with_ema_weights_between_steps_leaves_training_bitwise_unchanged(mode):
    """Train 3 micro-steps, evaluate with the EMA swapped in (mid-window: _grad_sum and the guard's window copy are
    live), train 3 more: every Parameter bit-identical to 6 steps without the evaluation."""
    from trainkit.callbacks import swap_in_ema

    data = batches(6, 4, seed=12)
    eval_x = ms.Tensor(batches(1, 6, seed=13)[0][0])
    final = []
    for evaluate in (True, False):
        net = TinyMLP(batch_norm=True)
        opt = nn.Adam(net.trainable_params(), learning_rate=0.05)
        wrapper = TrainingWrapper(loss_network(net), opt, ema_decay=0.6, accumulation_steps=2, skip_nonfinite=True)
        run(wrapper, data[:3])
        if evaluate:
            live = weights_of(net)
            with swap_in_ema(wrapper.ema):
                net.set_train(False)
                net(eval_x).asnumpy()
                swapped = weights_of(net)
            for name in live:  # the EMA really was in place (moving statistics included) during the evaluation
                np.testing.assert_array_equal(swapped[name], wrapper.parameters_dict()["ema." + name].asnumpy())
            assert not np.array_equal(swapped["bn.moving_mean"], live["bn.moving_mean"])
        run(wrapper, data[3:])
        final.append({p.name: p.asnumpy() for p in wrapper.get_parameters()})
    assert final[0].keys() == final[1].keys()
    for name in final[0]:
        np.testing.assert_array_equal(final[0][name], final[1][name], err_msg=name)


@pytest.mark.parametrize("every", [1, 3])
def test_ema_every_n_updates_on_every_nth_applied_step_with_the_decay_to_the_nth(mode, every):
    """ema_every=N: after applied steps N, 2N, ... ema = d**N * ema + (1 - d**N) * w; between them nothing."""
    decay, steps = 0.8, 7
    net = TinyMLP(batch_norm=True)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    wrapper = TrainingWrapper(loss_network(net), opt, ema_decay=decay, ema_every=every)
    expected = {k: v.astype(np.float64) for k, v in weights_of(net).items()}
    for step, batch in enumerate(batches(steps, 4, seed=21), start=1):
        run(wrapper, [batch])
        if step % every == 0:
            d = decay ** every
            expected = {k: d * expected[k] + (1 - d) * v for k, v in weights_of(net).items()}
        shadows = {p.name[4:]: p.asnumpy() for p in wrapper.get_parameters() if p.name.startswith("ema.")}
        for name, value in expected.items():
            np.testing.assert_allclose(shadows[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} step {step}")
    assert int(wrapper.ema.num_updates.asnumpy()) == steps // every


def test_ema_every_n_resumes_bitwise(graph_mode, tmp_path):
    """The calls since the last update (``ema_step``) are saved: 2 steps, checkpoint, a new wrapper, 3 steps
    equal 5 steps in one go, bit for bit -- the update falls on step 3 either way."""
    data = batches(5, 4, seed=22)

    def build():
        net = TinyMLP(batch_norm=True)
        opt = nn.Adam(net.trainable_params(), learning_rate=0.05)
        return TrainingWrapper(loss_network(net), opt, ema_decay=0.7, ema_every=3)

    straight = build()
    run(straight, data)
    first = build()
    run(first, data[:2])
    path = str(tmp_path / "two_steps.ckpt")
    ms.save_checkpoint(first, path)
    resumed = build()
    not_loaded, _ = ms.load_param_into_net(resumed, ms.load_checkpoint(path), strict_load=True)
    assert not not_loaded and "ema_step" in ms.load_checkpoint(path)
    run(resumed, data[2:])
    expected = {p.name: p.asnumpy() for p in straight.get_parameters()}
    got = {p.name: p.asnumpy() for p in resumed.get_parameters()}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert int(resumed.ema.num_updates.asnumpy()) == 1
