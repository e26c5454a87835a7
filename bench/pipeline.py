"""Row 5: the resnet50_cifar10 input pipeline alone, against what ResNet-50 consumes, and end to end."""
from __future__ import annotations

import os
import tempfile
import time
from typing import List

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from bench.common import Row, Settings, Stepper, alternate, batch_tensors, large_backbone, loss_network, ratio, setup
from trainkit import TrainingWrapper
from trainkit.data.cifar10 import Cifar10Data

#: num_parallel_workers tried; MindSpore refuses more than the machine's cores.
WORKERS = tuple(sorted({1, 2, 4} & set(range(1, (os.cpu_count() or 1) + 1))))


def write_cifar10(root: str, per_file: int) -> None:
    """Random images in CIFAR-10's binary format (label byte, then the R, G and B planes), five training files."""
    folder = os.path.join(root, "cifar-10-batches-bin")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = (np.arange(per_file) % 10).astype(np.uint8)[:, None]
        pixels = rng.integers(0, 256, size=(per_file, 3 * 32 * 32), dtype=np.uint8)
        with open(os.path.join(folder, name), "wb") as file:
            file.write(np.concatenate([labels, pixels], axis=1).tobytes())


def _pipeline_rate(root: str, batch: int, image: int, workers: int) -> float:
    """Samples/s of one pass over the training pipeline (augment, resize, normalise, HWC->CHW, batch)."""
    data = Cifar10Data(root=root, image_size=image, batch_size=batch, num_parallel_workers=workers)
    data.prepare()
    dataset = data.train_dataset()
    iterator = dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)
    start = time.perf_counter()
    samples = sum(len(images) for images, _ in iterator)
    return samples / (time.perf_counter() - start)


def run(settings: Settings) -> List[Row]:
    per_file = 16 if settings.smoke else 400
    batch, image = settings.batch, settings.image
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-") as root:
        write_cifar10(root, per_file)
        _pipeline_rate(root, batch, image, 1)  # warm the file cache and MindSpore's dataset engine
        rates = {workers: _pipeline_rate(root, batch, image, workers) for workers in WORKERS}
        best_workers = max(rates, key=rates.get)

        ms.set_seed(0)
        backbone = large_backbone(settings)
        optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)
        compute = Stepper(TrainingWrapper(loss_network(backbone), optimizer), batch_tensors(batch, 3, image),
                          settings.warmup)
        data = Cifar10Data(root=root, image_size=image, batch_size=batch, num_parallel_workers=best_workers)
        data.prepare()
        batches = data.train_dataset().repeat().create_tuple_iterator(output_numpy=True)

        def fed():
            for _ in range(settings.large_steps):
                images, labels = next(batches)
                compute.cell(Tensor(images), Tensor(labels))[0].asnumpy()

        fed()
        seconds = alternate({"fed": fed, "compute": compute.run(settings.large_steps)}, settings.reps)
    consumption = batch * settings.large_steps / float(np.median(seconds["compute"]))
    value, spread = ratio(seconds, "compute", "fed")  # throughput fed from data / compute only
    where = setup(settings.large_model, batch, image, pipeline="resnet50_cifar10 train (crop+flip, resize, normalise)",
                  num_parallel_workers=best_workers, records=5 * per_file)
    rate_text = ", ".join(f"{w} workers {r:.0f}" for w, r in rates.items())
    starves = "starves" if rates[best_workers] < consumption else "does not starve"
    return [
        Row("5", "pipeline alone / model consumption (samples/s)", rates[best_workers] / consumption, "x",
            "reported", None, "", f"pipeline {rate_text} samples/s; {settings.large_model} consumes "
            f"{consumption:.1f} samples/s: the pipeline {starves} the model", where),
        Row("5", "end to end (fed by the pipeline) / compute only", value, "x", ">= 0.9", value >= 0.9, spread,
            f"num_parallel_workers={best_workers}", where),
    ]
