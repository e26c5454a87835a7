"""A network trained with trainkit's fused GELU and max pooling (`model.layer_impl=auto` on CPU) exports with
MindSpore's layers: the ONNX file onnxruntime runs equals the network written here in NumPy from the checkpoint's
weights."""
import math

import mindspore as ms
import numpy as np
import pytest

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.kernels import gelu_kernel
from trainkit.tools.deploy import export_model

pytest.importorskip("onnxruntime")


@pytest.mark.skipif(gelu_kernel() is None, reason="trainkit's C++ kernels do not build here")
def test_a_run_trained_with_the_fused_layers_exports_to_onnx_as_numpy_computes_it(tmp_path):
    import onnxruntime

    run = tmp_path / "run"
    trained = train(compose_config([f"run_dir={run}", "logger.progress=off", "trainer.epochs=1", "trainer.test=false",
                                    "model._target_=tests.common.models.GeluDigits", "model.width=8",
                                    "data.batch_size=128", "wrapper.ema_decay=null"]))
    assert type(trained.network.act).__name__ == "FusedGELU"  # it trained with the kernels
    assert type(trained.network.pool).__name__ == "FusedMaxPool2d"
    done = export_model(run, tmp_path / "model.onnx", trust=["tests.common.models"])
    saved = ms.load_checkpoint(str(run / "checkpoints" / "best.ckpt"))
    w1, b1, w2, b2 = (saved[name].asnumpy().astype(np.float64) for name in
                      ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    images = np.random.default_rng(0).standard_normal((4, *done.input_shape[1:])).astype(np.float32)
    padded = np.pad(images.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    pooled = np.array([[[[padded[n, c, 2 * r:2 * r + 3, 2 * q:2 * q + 3].max() for q in range(4)] for r in range(4)]
                        for c in range(images.shape[1])] for n in range(len(images))])
    hidden = pooled.reshape(len(images), -1) @ w1.T + b1
    hidden = 0.5 * hidden * (1.0 + np.vectorize(math.erf)(hidden / math.sqrt(2.0)))
    expected = hidden @ w2.T + b2
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    got = np.concatenate([session.run(None, {session.get_inputs()[0].name: image[None]})[0] for image in images])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
