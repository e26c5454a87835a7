"""The evaluation loss is the mean over samples, checked against NumPy, with a smaller last batch."""
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Loss, Model

from trainkit.parts.metrics import SampleMeanLoss
from trainkit.step.mixed_precision import Float32EvalCell


def numpy_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_probabilities[np.arange(len(labels)), labels]


def test_the_evaluation_loss_weighs_every_sample_once_with_a_smaller_last_batch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=10).astype(np.int32)
    network = nn.Dense(3, 4)
    eval_cell = Float32EvalCell(network, nn.CrossEntropyLoss())
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)  # batches of 4, 4 and 2
    model = Model(network, eval_network=eval_cell, eval_indexes=[0, 1, 2],
                  metrics={"loss": SampleMeanLoss(), "batch_mean": Loss()})
    result = model.eval(data, dataset_sink_mode=False)

    weight, bias = network.weight.asnumpy(), network.bias.asnumpy()
    per_sample = numpy_cross_entropy(x.astype(np.float64) @ weight.T + bias, y)
    assert abs(result["loss"] - per_sample.mean()) < 1e-6
    batch_means = np.mean([per_sample[:4].mean(), per_sample[4:8].mean(), per_sample[8:].mean()])
    assert abs(result["batch_mean"] - batch_means) < 1e-6  # what MindSpore's Loss reports instead
    assert abs(per_sample.mean() - batch_means) > 1e-4  # the data makes the two differ


def test_a_per_sample_loss_passes_through_unchanged():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    network = nn.Dense(2, 2)
    labels = ms.Tensor(np.array([0, 1, 0], np.int32))
    losses = Float32EvalCell(network, nn.CrossEntropyLoss(reduction="none"))(ms.Tensor(x), labels)[0]
    assert losses.shape == (3,)
