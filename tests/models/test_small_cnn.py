"""SmallCNN: any input size, the parameter count worked out by hand, and it learns handwritten digits in a few steps."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from trainkit.models import SmallCNN


@pytest.mark.parametrize("in_channels, size", [(1, 8), (3, 32), (3, 8), (1, 5)])
def test_output_is_batch_by_classes_for_any_input_size(mode, in_channels, size):
    net = SmallCNN(num_classes=10, in_channels=in_channels)
    x = Tensor(np.random.RandomState(0).rand(2, in_channels, size, size).astype(np.float32))
    logits = net(x).asnumpy()
    assert logits.shape == (2, 10)
    assert np.all(np.isfinite(logits))


def test_parameter_count_and_initialisation():
    net = SmallCNN(num_classes=10, in_channels=1, width=16, num_downsamples=2)
    # 3x3 convs without bias, each followed by BN (gamma, beta): 1->16, 16->32, 32->64; then Dense(64, 10).
    expected = (1 * 16 * 9 + 2 * 16) + (16 * 32 * 9 + 2 * 32) + (32 * 64 * 9 + 2 * 64) + (64 * 10 + 10)
    assert sum(p.size for p in net.trainable_params()) == expected == 24_058
    values = {p.name: p.asnumpy() for p in net.get_parameters()}
    assert all(np.all(v == 1.0) for name, v in values.items() if name.endswith(".gamma"))
    assert all(np.all(v == 0.0) for name, v in values.items() if name.endswith(".beta"))
    assert np.all(values["fc.bias"] == 0.0)
    assert np.abs(values["fc.weight"]).max() <= 1.0 / np.sqrt(64)  # torch's Linear bound 1/sqrt(fan_in)
    wide = SmallCNN(width=64, num_downsamples=1)
    weight = {p.name: p.asnumpy() for p in wide.get_parameters() if p.name.endswith("weight")}
    conv = [w for w in weight.values() if w.shape == (128, 64, 3, 3)]
    assert len(conv) == 1
    assert conv[0].std() == pytest.approx(np.sqrt(2.0 / (128 * 9)), rel=0.05)  # He normal, fan_out


def test_stem_stride_and_num_downsamples_set_the_resolution():
    """stem_stride=2 halves the resolution at once; each downsampling stage halves it again."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        x = Tensor(np.zeros((1, 3, 32, 32), np.float32))
        # conv_impl=unfold: `features` takes and gives (N, C, H, W) (channel_major would give (C, N, H, W))
        assert SmallCNN(in_channels=3, conv_impl="unfold").features(x).shape == (1, 64, 8, 8)
        assert SmallCNN(in_channels=3, stem_stride=2, conv_impl="unfold").features(x).shape == (1, 64, 4, 4)
        assert SmallCNN(in_channels=3, width=4, num_downsamples=3, conv_impl="unfold").features(x).shape == (
            1, 32, 4, 4)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def test_learns_handwritten_digits_in_a_few_steps(graph_mode):
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = (digits.images[:320] / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8] in [0, 1]
    y = digits.target[:320].astype(np.int32)
    ms.set_seed(0)
    net = SmallCNN(num_classes=10, in_channels=1)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), nn.Adam(net.trainable_params(), learning_rate=0.01))
    step.set_train()
    losses = []
    for _epoch in range(3):
        for i in range(0, 320, 32):
            losses.append(float(step(Tensor(x[i:i + 32]), Tensor(y[i:i + 32])).asnumpy()))
    assert losses[0] > 1.8  # about ln(10) = 2.3 at the start
    assert np.mean(losses[-10:]) < 0.3 * losses[0]
    net.set_train(False)
    accuracy = (net(Tensor(x)).asnumpy().argmax(axis=1) == y).mean()
    assert accuracy > 0.85  # chance is 0.1


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_classes": 0}, ValueError, "num_classes"),
    ({"num_classes": "10"}, TypeError, "num_classes"),
    ({"in_channels": 0}, ValueError, "in_channels"),
    ({"width": 2.5}, TypeError, "width"),
    ({"num_downsamples": -1}, ValueError, "num_downsamples"),
    ({"stem_stride": 3}, ValueError, "stem_stride must be 1 or 2"),
    ({"widht": 16}, TypeError, "widht"),
])
def test_bad_arguments_raise_naming_the_argument(kwargs, error, words):
    with pytest.raises(error, match=words):
        SmallCNN(**kwargs)
