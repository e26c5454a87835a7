"""ResNet: torchvision's parameter counts, names and shapes, its initialisation, and forwards checked against NumPy."""
from __future__ import annotations

from typing import Dict, Tuple

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from trainkit import kernels
from trainkit.models.conv import batch_norm2d, conv2d
from trainkit.models.resnet import BasicBlock, Bottleneck, resnet18, resnet34, resnet50, resnet101, resnet152

# torchvision's `sum(p.numel() for p in resnetXX(num_classes=1000).parameters())`, as published with its weights.
TORCHVISION_TRAINABLE_PARAMETERS = {
    resnet18: 11_689_512,
    resnet34: 21_797_672,
    resnet50: 25_557_032,
    resnet101: 44_549_160,
    resnet152: 60_192_808,
}
BN_EPS = 1e-5  # torch and MindSpore BatchNorm2d default


def parameters(net: nn.Cell) -> Dict[str, np.ndarray]:
    return {p.name: p.asnumpy() for p in net.get_parameters()}


@pytest.mark.parametrize("factory", list(TORCHVISION_TRAINABLE_PARAMETERS), ids=lambda f: f.__name__)
def test_trainable_parameter_count_equals_torchvision(factory):
    net = factory(num_classes=1000)
    assert sum(p.size for p in net.trainable_params()) == TORCHVISION_TRAINABLE_PARAMETERS[factory]


# ---- names and shapes, written out from torchvision's state_dict layout ------------------------------------------

def torchvision_layout(bottleneck: bool, blocks: Tuple[int, ...], num_classes: int) -> Dict[str, tuple]:
    """torchvision's resnet state_dict names and shapes (without num_batches_tracked), BN leaves renamed for MindSpore.

    torchvision: stem conv 7x7/64; layer i has width 64*2**i; Bottleneck is conv1 1x1, conv2 3x3, conv3 1x1 to 4*width;
    BasicBlock is two 3x3; block 0 of a layer has `downsample` (1x1 conv + BN) when stride or channels change.
    """
    def bn(prefix, channels):
        return {f"{prefix}.{leaf}": (channels,) for leaf in ("gamma", "beta", "moving_mean", "moving_variance")}

    expansion = 4 if bottleneck else 1
    layout = {"conv1.weight": (64, 3, 7, 7), **bn("bn1", 64)}
    in_channels = 64
    for layer, count in enumerate(blocks):
        width = 64 * 2 ** layer
        for index in range(count):
            p = f"layer{layer + 1}.{index}"
            if bottleneck:
                layout[f"{p}.conv1.weight"] = (width, in_channels, 1, 1)
                layout[f"{p}.conv2.weight"] = (width, width, 3, 3)
                layout[f"{p}.conv3.weight"] = (width * 4, width, 1, 1)
                layout.update({**bn(f"{p}.bn1", width), **bn(f"{p}.bn2", width), **bn(f"{p}.bn3", width * 4)})
            else:
                layout[f"{p}.conv1.weight"] = (width, in_channels, 3, 3)
                layout[f"{p}.conv2.weight"] = (width, width, 3, 3)
                layout.update({**bn(f"{p}.bn1", width), **bn(f"{p}.bn2", width)})
            if index == 0 and (layer > 0 or in_channels != width * expansion):
                layout[f"{p}.downsample.0.weight"] = (width * expansion, in_channels, 1, 1)
                layout.update(bn(f"{p}.downsample.1", width * expansion))
            in_channels = width * expansion
    layout["fc.weight"] = (num_classes, 512 * expansion)
    layout["fc.bias"] = (num_classes,)
    return layout


def test_resnet50_names_and_shapes_are_torchvisions():
    shapes = {name: value.shape for name, value in parameters(resnet50(num_classes=10)).items()}
    assert shapes == torchvision_layout(bottleneck=True, blocks=(3, 4, 6, 3), num_classes=10)
    # A few entries spelled out, as printed from torchvision's resnet50(num_classes=10).state_dict().
    assert len(shapes) == 320 - 53  # 320 state_dict entries less 53 BatchNorms' num_batches_tracked
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["bn1.moving_mean"] == (64,)
    assert shapes["layer1.0.conv1.weight"] == (64, 64, 1, 1)
    assert shapes["layer1.0.conv2.weight"] == (64, 64, 3, 3)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer1.0.downsample.1.beta"] == (256,)
    assert shapes["layer2.0.downsample.0.weight"] == (512, 256, 1, 1)
    assert shapes["layer3.5.conv3.weight"] == (1024, 256, 1, 1)
    assert shapes["layer4.2.bn3.moving_variance"] == (2048,)
    assert shapes["fc.weight"] == (10, 2048) and shapes["fc.bias"] == (10,)
    blocks = {layer: {name.split(".")[1] for name in shapes if name.startswith(layer + ".")} for layer in
              ("layer1", "layer2", "layer3", "layer4")}
    assert {layer: len(indices) for layer, indices in blocks.items()} == {
        "layer1": 3, "layer2": 4, "layer3": 6, "layer4": 3}
    assert sorted(name for name in shapes if name.endswith("downsample.0.weight")) == [
        f"layer{i}.0.downsample.0.weight" for i in range(1, 5)]


def test_resnet18_names_and_shapes_are_torchvisions():
    net = resnet18(num_classes=7, in_channels=1)
    shapes = {name: value.shape for name, value in parameters(net).items()}
    expected = torchvision_layout(bottleneck=False, blocks=(2, 2, 2, 2), num_classes=7)
    expected["conv1.weight"] = (64, 1, 7, 7)  # in_channels=1
    assert shapes == expected
    assert len(shapes) == 122 - 20  # 122 state_dict entries less 20 BatchNorms' num_batches_tracked
    assert not any(name.startswith("layer1.0.downsample") for name in shapes)  # 64 -> 64 at stride 1
    assert shapes["layer1.0.conv1.weight"] == (64, 64, 3, 3)
    assert shapes["layer2.0.conv1.weight"] == (128, 64, 3, 3)
    assert shapes["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    assert shapes["layer4.1.bn2.gamma"] == (512,)
    assert shapes["fc.weight"] == (7, 512)
    assert isinstance(net.layer1, nn.SequentialCell) and isinstance(net.layer1[0], BasicBlock)
    assert isinstance(resnet50(num_classes=2).layer3[5], Bottleneck)


# ---- initialisation ------------------------------------------------------------------------------------------------

def test_initialisation_is_torchvisions():
    values = parameters(resnet50(num_classes=10))
    # kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2 / (out_channels * k * k)).
    for name, fan_out in [("layer4.0.conv2.weight", 512 * 3 * 3), ("layer3.0.conv3.weight", 1024 * 1 * 1)]:
        weight = values[name]
        assert weight.std() == pytest.approx(np.sqrt(2.0 / fan_out), rel=0.02), name
        assert abs(weight.mean()) < 0.02 * np.sqrt(2.0 / fan_out), name
    for name, value in values.items():
        if name.endswith(".gamma"):
            assert np.all(value == 1.0), name
        elif name.endswith(".beta"):
            assert np.all(value == 0.0), name
    # Dense: kaiming_uniform_(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias starts at zero.
    bound = 1.0 / np.sqrt(2048)
    assert np.abs(values["fc.weight"]).max() <= bound
    assert np.abs(values["fc.weight"]).max() > 0.99 * bound
    assert values["fc.weight"].std() == pytest.approx(bound / np.sqrt(3), rel=0.03)
    assert np.all(values["fc.bias"] == 0.0)


@pytest.mark.parametrize("conv_impl", ["native", "unfold"])
def test_a_seeds_weights_are_those_of_drawing_mindspores_default_init_and_replacing_it(monkeypatch, conv_impl):
    """The convolutions skip drawing MindSpore's default init (init_like_torchvision replaces it) without moving
    NumPy's global stream: built the way a ResNet was built before, with nn.Conv2d's HeUniform drawn, a seed gives
    the same bits, and the stream stands at the same place afterwards."""
    import math

    from mindspore.common.initializer import HeUniform

    import trainkit.models.resnet as resnet_module

    def built(seed: int):
        ms.set_seed(seed)
        np.random.seed(seed)
        network = resnet18(num_classes=10, conv_impl=conv_impl)
        return parameters(network), np.random.randint(0, 2 ** 31)

    skipped, after_skipped = built(7)
    monkeypatch.setattr(resnet_module, "_DefaultInitsSeed", lambda: HeUniform(math.sqrt(5)))  # nn.Conv2d's default
    drawn, after_drawn = built(7)
    assert skipped.keys() == drawn.keys()
    for name in drawn:
        np.testing.assert_array_equal(skipped[name], drawn[name], err_msg=name)
    assert after_skipped == after_drawn
    assert not np.array_equal(built(8)[0]["conv1.weight"], drawn["conv1.weight"])  # the seed does matter


def test_a_block_built_on_its_own_keeps_mindspores_default_init():
    """Only a whole ResNet, which replaces every convolution's weight, skips the default: a block built alone has
    nn.Conv2d's HeUniform (a = sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    block = Bottleneck(64, 16, conv_impl="native")
    weight = block.conv2.weight.asnumpy()
    bound = 1.0 / np.sqrt(16 * 3 * 3)
    assert np.abs(weight).max() <= bound
    assert np.abs(weight).max() > 0.95 * bound
    assert weight.std() == pytest.approx(bound / np.sqrt(3), rel=0.1)


@pytest.mark.parametrize("factory, last_bn", [(resnet18, "bn2"), (resnet50, "bn3")], ids=["basic", "bottleneck"])
def test_zero_init_residual_zeroes_the_last_bn_gamma_of_every_block_and_nothing_else(factory, last_bn):
    values = parameters(factory(num_classes=10, zero_init_residual=True))
    zeroed = {name for name, value in values.items() if name.endswith(".gamma") and np.all(value == 0.0)}
    blocks = (2, 2, 2, 2) if factory is resnet18 else (3, 4, 6, 3)
    assert zeroed == {f"layer{layer + 1}.{i}.{last_bn}.gamma" for layer, count in enumerate(blocks)
                      for i in range(count)}
    assert all(np.all(values[name] == 1.0) for name in values if name.endswith(".gamma") and name not in zeroed)
    assert not any(name.endswith(".gamma") and np.any(value == 0.0)
                   for name, value in parameters(factory(num_classes=10)).items())


# ---- forward ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("factory, size", [(resnet18, 8), (resnet50, 32)], ids=["resnet18-8x8", "resnet50-32x32"])
def test_forward_gives_finite_logits_of_shape_batch_by_classes(mode, factory, size):
    net = factory(num_classes=10)
    x = Tensor(np.random.RandomState(0).randn(2, 3, size, size).astype(np.float32))
    logits = net(x).asnumpy()
    assert logits.shape == (2, 10)
    assert np.all(np.isfinite(logits))


def np_conv(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """torch.nn.functional.conv2d (no bias) in NumPy: x [N, C, H, W], w [O, C, k, k]."""
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    k = w.shape[2]
    out_h = (x.shape[2] - k) // stride + 1
    out_w = (x.shape[3] - k) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            patch = x[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out


def np_bn(x: np.ndarray, values: Dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """Inference BatchNorm with the running statistics."""
    def per_channel(leaf):
        return values[f"{prefix}.{leaf}"].reshape(1, -1, 1, 1)
    return (x - per_channel("moving_mean")) / np.sqrt(per_channel("moving_variance") + BN_EPS) * per_channel(
        "gamma") + per_channel("beta")


def relu(x):
    return np.maximum(x, 0.0)


def randomise(cell: nn.Cell, seed: int) -> Dict[str, np.ndarray]:
    """Random weights and BN statistics (variance positive), so the reference is not trivially satisfied."""
    rng = np.random.RandomState(seed)
    values = {}
    for param in cell.get_parameters():
        value = rng.randn(*param.shape).astype(np.float32) * 0.5
        if param.name.endswith("moving_variance"):
            value = rng.uniform(0.5, 2.0, param.shape).astype(np.float32)
        param.set_data(Tensor(value))
        values[param.name] = value.astype(np.float64)
    return values


def shortcut(x, values, stride):
    if "downsample.0.weight" not in values:
        return x
    return np_bn(np_conv(x, values["downsample.0.weight"], stride, 0), values, "downsample.1")


def np_basic_block(x, values, stride):
    out = relu(np_bn(np_conv(x, values["conv1.weight"], stride, 1), values, "bn1"))
    out = np_bn(np_conv(out, values["conv2.weight"], 1, 1), values, "bn2")
    return relu(out + shortcut(x, values, stride))


def np_bottleneck(x, values, stride):
    """torchvision v1.5: the stride sits on the 3x3 conv."""
    out = relu(np_bn(np_conv(x, values["conv1.weight"], 1, 0), values, "bn1"))
    out = relu(np_bn(np_conv(out, values["conv2.weight"], stride, 1), values, "bn2"))
    out = np_bn(np_conv(out, values["conv3.weight"], 1, 0), values, "bn3")
    return relu(out + shortcut(x, values, stride))


def projection(in_channels, out_channels, stride, conv_impl="native"):
    conv = conv2d(in_channels, out_channels, 1, stride=stride, padding=0, conv_impl=conv_impl)
    return nn.SequentialCell([conv, batch_norm2d(out_channels, conv_impl)])


CONV_IMPLS_HERE = ["native", "unfold"] + (["channel_major"] if kernels.library()[0] else [])


@pytest.mark.parametrize("conv_impl", CONV_IMPLS_HERE)
@pytest.mark.parametrize("block, reference, in_channels, channels, stride, with_downsample", [
    (BasicBlock, np_basic_block, 4, 4, 1, False),
    (BasicBlock, np_basic_block, 4, 6, 2, True),
    (Bottleneck, np_bottleneck, 8, 3, 2, True),
], ids=["basic-identity", "basic-stride2-downsample", "bottleneck-stride2-downsample"])
def test_block_forward_equals_numpy_reference(mode, conv_impl, block, reference, in_channels, channels, stride,
                                              with_downsample):
    """channel_major blocks take and give (C, N, H, W); compared in (N, C, H, W)."""
    downsample = projection(in_channels, channels * block.expansion, stride, conv_impl) if with_downsample else None
    cell = block(in_channels, channels, stride, downsample, conv_impl)
    values = randomise(cell, seed=3)
    cell.set_train(False)
    x = np.random.RandomState(4).randn(2, in_channels, 6, 6).astype(np.float32)
    if conv_impl == "channel_major":
        got = cell(Tensor(x.transpose(1, 0, 2, 3).copy())).asnumpy().transpose(1, 0, 2, 3)
    else:
        got = cell(Tensor(x)).asnumpy()
    expected = reference(x.astype(np.float64), values, stride)
    assert got.shape == expected.shape == (2, channels * block.expansion, 6 // stride, 6 // stride)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_stem_maxpool_pads_with_minus_infinity_like_torch(mode):
    """torch's MaxPool2d(3, 2, padding=1) ignores the padding; zero padding would win over negative inputs."""
    x = np.random.RandomState(5).randn(2, 3, 7, 6).astype(np.float32) - 1.0  # mostly negative
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    out_h, out_w = (7 + 2 - 3) // 2 + 1, (6 + 2 - 3) // 2 + 1
    expected = np.empty((2, 3, out_h, out_w), np.float32)
    for i in range(out_h):
        for j in range(out_w):
            expected[:, :, i, j] = padded[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
    got = resnet18(num_classes=2, conv_impl="native").maxpool(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(got, expected)
    if kernels.library()[0]:  # the same per (channel, image) plane on (C, N, H, W)
        got = resnet18(num_classes=2, conv_impl="channel_major").maxpool(Tensor(x.transpose(1, 0, 2, 3).copy()))
        np.testing.assert_array_equal(got.asnumpy().transpose(1, 0, 2, 3), expected)


@pytest.mark.skipif(not kernels.library()[0], reason="channel_major needs trainkit's kernels")
def test_channel_major_batch_norm_normalises_each_channel_by_its_batch_statistics_as_numpy(mode):
    """Training mode: (x - mean) / sqrt(var + eps) per channel over N, H, W; the moving statistics move towards
    the batch's (MindSpore's momentum 0.9, the unbiased variance), as nn.BatchNorm2d's do."""
    from trainkit.models.conv import ChannelMajorBatchNorm2d
    rng = np.random.RandomState(6)
    x = (rng.randn(4, 3, 5, 2) * np.array([1.0, 3.0, 0.5]).reshape(1, 3, 1, 1) + 2).astype(np.float32)
    bn = ChannelMajorBatchNorm2d(3)
    bn.gamma.set_data(Tensor(np.array([1.0, 2.0, 0.5], np.float32)))
    bn.beta.set_data(Tensor(np.array([0.0, -1.0, 3.0], np.float32)))
    bn.set_train(True)
    got = bn(Tensor(x.transpose(1, 0, 2, 3).copy())).asnumpy().transpose(1, 0, 2, 3)
    mean = x.astype(np.float64).mean(axis=(0, 2, 3))
    variance = x.astype(np.float64).var(axis=(0, 2, 3))
    expected = ((x - mean.reshape(1, 3, 1, 1)) / np.sqrt(variance.reshape(1, 3, 1, 1) + BN_EPS)
                * np.array([1.0, 2.0, 0.5]).reshape(1, 3, 1, 1) + np.array([0.0, -1.0, 3.0]).reshape(1, 3, 1, 1))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    count = x.size / 3
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.asnumpy(), 0.9 + 0.1 * variance * count / (count - 1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not kernels.library()[0], reason="channel_major needs trainkit's kernels")
def test_channel_major_resnet_trains_as_the_nchw_one(graph_mode):
    """Same weights, one SGD step in training mode (batch statistics): the same loss, gradients and moving
    statistics as conv_impl=native (MindSpore's own convolution), to float32 summation order."""
    from trainkit.models import resnet18

    def one_step(conv_impl):
        ms.set_seed(0)
        network = resnet18(num_classes=5, conv_impl=conv_impl)
        loss = nn.WithLossCell(network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        step = nn.TrainOneStepCell(loss, nn.SGD(network.trainable_params(), learning_rate=0.1))
        rng = np.random.RandomState(7)
        x = Tensor(rng.randn(6, 3, 16, 16).astype(np.float32))
        label = Tensor(rng.randint(0, 5, 6).astype(np.int32))
        value = float(step(x, label).asnumpy())
        return value, {p.name: p.asnumpy() for p in network.get_parameters()}

    native_loss, native = one_step("native")
    ours_loss, ours = one_step("channel_major")
    assert ours.keys() == native.keys()
    assert abs(ours_loss - native_loss) < 1e-5
    for name, value in native.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


# ---- arguments -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_classes": 0}, ValueError, "num_classes"),
    ({"num_classes": "10"}, TypeError, "num_classes"),
    ({"num_classes": 10.0}, TypeError, "num_classes"),
    ({"num_classes": True}, TypeError, "num_classes"),
    ({"in_channels": 0}, ValueError, "in_channels"),
    ({"zero_init_residual": "false"}, TypeError, "zero_init_residual"),
    ({"num_class": 10}, TypeError, "num_class"),
])
def test_bad_arguments_raise_naming_the_argument(kwargs, error, words):
    with pytest.raises(error, match=words):
        resnet18(**kwargs)


def test_resnet_rejects_a_bad_block_or_layers():
    from trainkit.models.resnet import ResNet

    with pytest.raises(TypeError, match="block must be BasicBlock or Bottleneck"):
        ResNet(nn.Dense, (1, 1, 1, 1))
    with pytest.raises(TypeError, match="layers must be a sequence of 4"):
        ResNet(BasicBlock, (2, 2, 2))
    with pytest.raises(ValueError, match=r"layers\[2\] must be an int >= 1"):
        ResNet(BasicBlock, (2, 2, 0, 2))
