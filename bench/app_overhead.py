"""Row 4: the whole app (`python -m trainkit`'s `trainkit.app.train`) against a bare `Model.train` script."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import List

import mindspore as ms
from mindspore import nn
from mindspore.train import Accuracy, Model

from bench.common import Row, Settings, ratio, setup
from trainkit.app import train
from trainkit.config import compose_config
from trainkit.data.digits import DigitsData
from trainkit.models import SmallCNN

LR = 0.01


def _app(run_dir: Path, epochs: int) -> float:
    """The quick-start recipe with a constant learning rate and no EMA, evaluating once at the end; train seconds.

    Everything else is on as a user gets it: progress, metrics file, TensorBoard, checkpoints and best.ckpt.
    """
    cfg = compose_config(["recipe=digits_quickstart", f"trainer.epochs={epochs}", "trainer.eval_interval=0",
                          "lr_schedule=constant", "lr_schedule.warmup_epochs=0", f"optimizer.lr={LR}",
                          "wrapper.ema_decay=null", "logger.progress=log", f"run_dir={run_dir}"])
    return train(cfg).metrics["train_seconds"]


def _bare(epochs: int) -> float:
    """What a user writes without trainkit: the same network, optimizer and data, Model.train then Model.eval."""
    ms.set_seed(0)
    data = DigitsData(batch_size=32)
    data.prepare()
    network = SmallCNN(num_classes=10, in_channels=1)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Adam(network.trainable_params(), learning_rate=LR, weight_decay=0.0)
    model = Model(network, loss, optimizer, metrics={"accuracy": Accuracy()})
    start = time.perf_counter()
    model.train(epochs, data.train_dataset(), dataset_sink_mode=False)
    model.eval(data.eval_dataset(), dataset_sink_mode=False)
    return time.perf_counter() - start


def run(settings: Settings) -> List[Row]:
    epochs = settings.app_epochs
    seconds = {"app": [], "bare": []}
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-app-") as folder:
        for rep in range(settings.reps):
            for side in (("app", "bare") if rep % 2 == 0 else ("bare", "app")):
                if side == "app":
                    seconds["app"].append(_app(Path(folder) / f"run{rep}", epochs))
                else:
                    seconds["bare"].append(_bare(epochs))
    value, spread = ratio(seconds, "bare", "app")  # same steps on both sides: steps/s ratio = inverse time ratio
    steps = epochs * (DigitsData(batch_size=32).train_dataset().get_dataset_size())
    times = (f"{steps} steps ({epochs} epochs, compile and one final evaluation included): app "
             f"{sorted(seconds['app'])[len(seconds['app']) // 2]:.2f} s, bare Model.train "
             f"{sorted(seconds['bare'])[len(seconds['bare']) // 2]:.2f} s")
    return [Row("4", "steps/s, app (python -m trainkit) / bare Model.train", value, "x", ">= 0.95", value >= 0.95,
                spread, times, setup("small_cnn (digits recipe)", 32, 8, optimizer="adam", epochs=epochs))]
