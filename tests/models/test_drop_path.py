"""trainkit's DropPath (stochastic depth, what torchvision's StochasticDepth and timm's DropPath port to): in
training each sample's whole tensor is dropped with probability p and the rest scaled by 1 / (1 - p), as PyTorch's
``torchvision.ops.stochastic_depth`` computes it; the identity in evaluation; its draws resume from the call
counter a checkpoint keeps."""
import mindspore as ms
import numpy as np

from trainkit.models.dropout import DropPath


def _calls(layer, x, count):
    return [layer(ms.Tensor(x)).asnumpy() for _ in range(count)]


def test_each_sample_is_dropped_whole_with_probability_p_and_the_rest_scaled(graph_mode):
    """Mutation caught: the mask drawn per element (shape x.shape) instead of per sample; the scale left out."""
    ms.set_seed(5)
    layer = DropPath(0.25)
    layer.set_train(True)
    x = np.random.default_rng(0).normal(0, 1, (400, 3, 4, 4)).astype(np.float32)
    dropped = []
    for out in _calls(layer, x, 5):
        zero = np.all(out == 0, axis=(1, 2, 3))
        np.testing.assert_allclose(out[~zero], x[~zero] / 0.75, rtol=1e-6)
        dropped.append(zero)
    # 2,000 draws: 4 standard deviations of the dropped fraction is 0.039
    assert abs(np.mean(dropped) - 0.25) < 0.039
    assert (dropped[0] != dropped[1]).mean() > 0.2  # about 2 p (1 - p) = 0.375 when the calls are independent
    layer.set_train(False)
    np.testing.assert_array_equal(layer(ms.Tensor(x)).asnumpy(), x)


def test_batch_mode_and_no_scale_follow_pytorch_s_options(graph_mode):
    """torchvision's mode='batch': one draw for the whole batch; timm's scale_by_keep=False: kept paths unscaled.
    Mutation caught: per_sample ignored."""
    ms.set_seed(6)
    layer = DropPath(0.5, per_sample=False, scale=False)
    layer.set_train(True)
    x = np.random.default_rng(1).normal(0, 1, (64, 5)).astype(np.float32)
    outcomes = set()
    for out in _calls(layer, x, 12):
        assert np.array_equal(out, x) or not out.any()
        outcomes.add(bool(out.any()))
    assert outcomes == {True, False}  # 12 draws at p=0.5: both outcomes but with probability 2 ** -11


def test_a_layer_whose_counter_is_restored_draws_what_the_uninterrupted_one_draws(graph_mode):
    """Mutation caught: the counter not advanced per call (every call draws the same paths)."""
    x = np.ones((256, 2), np.float32)
    ms.set_seed(7)
    uninterrupted = DropPath(0.3, stream=4)
    uninterrupted.set_train(True)
    expected = _calls(uninterrupted, x, 3)
    assert not np.array_equal(expected[1], expected[2])
    ms.set_seed(7)
    resumed = DropPath(0.3, stream=4)
    resumed.set_train(True)
    resumed.calls.set_data(ms.Tensor(2, ms.int32))  # as a checkpoint taken after two steps restores it
    np.testing.assert_array_equal(resumed(ms.Tensor(x)).asnumpy(), expected[2])
