"""Bad constructor arguments fail at construction with a message naming the argument and what is valid."""
import pytest
from mindspore import amp, nn

from tests.common.models import TinyMLP, loss_network
from trainkit import TrainingWrapper


def build(**kwargs):
    net = TinyMLP()
    return TrainingWrapper(loss_network(net), nn.SGD(net.trainable_params(), 0.1), **kwargs)


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(accumulation_steps=0), ValueError, ["accumulation_steps", ">= 1"]),
    (dict(accumulation_steps=-2), ValueError, ["accumulation_steps", ">= 1"]),
    (dict(accumulation_steps=2.0), TypeError, ["accumulation_steps", "int"]),
    (dict(accumulation_steps=True), TypeError, ["accumulation_steps", "int"]),
    (dict(ema_decay=1.0), ValueError, ["ema_decay", "[0, 1)"]),
    (dict(ema_decay=-0.1), ValueError, ["ema_decay", "[0, 1)"]),
    (dict(ema_decay="0.9"), TypeError, ["ema_decay", "[0, 1)"]),
    (dict(max_grad_norm=-1.0), ValueError, ["max_grad_norm", "> 0"]),
    (dict(max_grad_norm=0), ValueError, ["max_grad_norm", "> 0"]),
    (dict(max_grad_norm=float("nan")), ValueError, ["max_grad_norm", "> 0"]),
    (dict(max_grad_norm="1"), TypeError, ["max_grad_norm", "> 0"]),
    (dict(loss_scale="dynamic"), TypeError, ["loss_scale", "DynamicLossScaler"]),
    (dict(loss_scale=True), TypeError, ["loss_scale", "StaticLossScaler"]),
    (dict(loss_scale=object()), TypeError, ["loss_scale", "number"]),
    (dict(loss_scale=0.5), ValueError, ["loss_scale", ">= 1"]),
    (dict(loss_scale=float("inf")), ValueError, ["loss_scale", ">= 1"]),
])
def test_bad_argument_is_named(kwargs, error, words):
    with pytest.raises(error) as info:
        build(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_network_and_optimizer_types_are_checked():
    net = TinyMLP()
    opt = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(TypeError, match="network"):
        TrainingWrapper(lambda x: x, opt)
    with pytest.raises(TypeError, match="optimizer"):
        TrainingWrapper(loss_network(net), "adam")


@pytest.mark.parametrize("loss_scale", [None, 1, 1024.0, amp.StaticLossScaler(8), amp.DynamicLossScaler(8, 2, 5)])
def test_valid_loss_scales_are_accepted(loss_scale):
    wrapper = build(loss_scale=loss_scale)
    if loss_scale is None:
        assert wrapper.loss_scaler is None
    else:
        assert "loss_scale.scale_value" in wrapper.parameters_dict()
