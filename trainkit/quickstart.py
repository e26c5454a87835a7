"""Train a small network with every TrainingWrapper feature on generated data (`make train`).

A stand-in for the Hydra app: it builds the real parts -- `mindspore.dataset`,
`mindspore.train.Model`, TrainingWrapper with dynamic loss scaling, clipping,
accumulation and EMA -- and reports accuracy with the live and the EMA weights.
"""
from __future__ import annotations

import argparse
import time
from typing import Dict, Tuple

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import amp, nn
from mindspore.train import LossMonitor, Model

from trainkit.wrapper import TrainingWrapper

NUM_CLASSES, NUM_FEATURES = 4, 16


def generated_data(num_samples: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters, one per class, whose classes overlap a little."""
    rng = np.random.RandomState(seed)
    centers = np.random.RandomState(0).randn(NUM_CLASSES, NUM_FEATURES).astype(np.float32) * 0.6
    labels = rng.randint(0, NUM_CLASSES, num_samples).astype(np.int32)
    features = centers[labels] + rng.randn(num_samples, NUM_FEATURES).astype(np.float32)
    return features, labels


def make_dataset(features, labels, batch_size: int, shuffle: bool) -> ds.Dataset:
    data = ds.NumpySlicesDataset({"data": features, "label": labels}, shuffle=shuffle)
    return data.batch(batch_size, drop_remainder=shuffle)


def small_mlp() -> nn.Cell:
    return nn.SequentialCell(nn.Dense(NUM_FEATURES, 64), nn.ReLU(), nn.Dense(64, NUM_CLASSES))


def main(argv=None) -> Dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)

    train_x, train_y = generated_data(4096, seed=1)
    test_x, test_y = generated_data(1024, seed=2)
    net = small_mlp()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.003)
    wrapper = TrainingWrapper(nn.WithLossCell(net, loss_fn), optimizer,
                              loss_scale=amp.DynamicLossScaler(2.0 ** 10, 2, 200),
                              max_grad_norm=1.0, accumulation_steps=2, ema_decay=0.99)
    model = Model(wrapper, eval_network=nn.WithEvalCell(net, loss_fn), eval_indexes=[0, 1, 2],
                  metrics={"accuracy", "loss"})
    train_set = make_dataset(train_x, train_y, batch_size=32, shuffle=True)
    steps = train_set.get_dataset_size()
    print(f"trainkit quickstart: MLP {NUM_FEATURES}-64-{NUM_CLASSES}, {len(train_x)} generated samples, "
          f"{args.epochs} epochs of {steps} micro-batches (accumulation 2), {args.mode} mode")
    start = time.perf_counter()
    model.train(args.epochs, train_set, callbacks=[LossMonitor(steps)], dataset_sink_mode=False)
    elapsed = time.perf_counter() - start

    test_set = make_dataset(test_x, test_y, batch_size=256, shuffle=False)
    live = model.eval(test_set, dataset_sink_mode=False)
    ema_net = small_mlp()
    ms.load_param_into_net(ema_net, wrapper.ema.shadow_weights(), strict_load=True)
    ema_model = Model(ema_net, loss_fn, metrics={"accuracy", "loss"})
    ema = ema_model.eval(test_set, dataset_sink_mode=False)
    result = {"accuracy": live["accuracy"], "loss": live["loss"], "ema_accuracy": ema["accuracy"],
              "ema_loss": ema["loss"], "train_seconds": elapsed,
              "optimizer_steps": int(optimizer.global_step.asnumpy().item())}
    print(f"test accuracy {live['accuracy']:.4f} (EMA weights {ema['accuracy']:.4f}), "
          f"test loss {live['loss']:.4f} (EMA {ema['loss']:.4f}); "
          f"{result['optimizer_steps']} optimizer steps in {elapsed:.1f} s")
    return result


if __name__ == "__main__":
    main()
