"""Half precision op by op over trainkit's im2col kernel is refused before anything is built or written.

Op by op (PyNative), MindSpore 2.10 casts the inputs of every operator inside a ``to_float(float16)`` Cell, the
custom kernel's too; the float32 kernel then reads half-precision memory. The first test shows that fact on one
convolution against NumPy (if MindSpore stops casting there, it fails, and the refusal can go); the second that
the app stops with one line naming the keys that fix it.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, amp, nn

from trainkit import kernels
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.errors import ConfigError
from trainkit.models.conv import UnfoldConv2d, kernel_convolutions

needs_kernels = pytest.mark.skipif(kernels.library()[0] is None, reason="trainkit's C++ kernels do not build here")


def numpy_conv3x3(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Cross-correlation, stride 1, zero padding 1, in float64."""
    n, _, h, w = x.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, weight.shape[0], h, w))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", padded[:, :, i:i + h, j:j + w], weight[:, :, i, j].astype(np.float64))
    return out


@needs_kernels
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_the_im2col_kernel_under_float16_is_right_in_a_graph_and_wrong_op_by_op(mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        conv = UnfoldConv2d(3, 5, 3, pad_mode="pad", padding=1, has_bias=False)
        network = amp.auto_mixed_precision(nn.SequentialCell([conv]), "O3")
        assert kernel_convolutions(network) == ["0"]
        x = np.random.default_rng(0).normal(size=(2, 3, 6, 6)).astype(np.float32)
        error = np.abs(network(Tensor(x)).asnumpy().astype(np.float64) - numpy_conv3x3(x, conv.weight.asnumpy())).max()
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    if mode == "graph":
        assert error < 1e-2  # float16 rounding
    else:  # garbage: far off, or not a number at all (half-precision memory read as float32)
        assert not error <= 1.0


@needs_kernels
def test_amp_in_pynative_mode_over_kernel_convolutions_stops_with_one_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        train(compose_config([f"run_dir={tmp_path}", "trainer.mode=pynative", "amp=O2", "logger.progress=off"]))
    message = str(error.value)
    assert "amp=O2 with trainer.mode=pynative" in message and "model.conv_impl=native" in message
    assert "\n" not in message
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()


@needs_kernels
def test_a_model_cell_cast_to_float16_without_amp_is_named_as_the_cause(tmp_path, monkeypatch):
    """amp=O0, but the model casts a Cell itself (``to_float``): the same hazard, said as what it is."""
    from trainkit.app import build

    original = build.build_loss_network

    def half_first_conv(backbone, loss_fn, level):
        backbone.features[0][0].to_float(ms.float16)
        return original(backbone, loss_fn, level)

    monkeypatch.setattr(build, "build_loss_network", half_first_conv)
    with pytest.raises(ConfigError, match=r"^a model Cell cast by to_float to half precision with trainer.mode=pyn"):
        train(compose_config([f"run_dir={tmp_path}", "trainer.mode=pynative", "logger.progress=off"]))


def test_amp_in_pynative_mode_over_fused_layers_stops_with_one_line(tmp_path):
    """A network whose only kernels are the fused GELU and max pooling (no convolution) is refused the same way."""
    from trainkit.kernels import gelu_kernel

    if gelu_kernel() is None:
        pytest.skip("trainkit's C++ kernels do not build here")
    with pytest.raises(ConfigError) as raised:
        train(compose_config([f"run_dir={tmp_path / 'run'}", "trainer.mode=pynative", "amp=O2", "trainer.epochs=1",
                              "model._target_=tests.common.models.GeluDigits", "logger.progress=off"]))
    message = str(raised.value)
    assert "\n" not in message and "2 GELU or max-pooling layers (pool, ...)" in message
    assert "model.layer_impl=native" in message
