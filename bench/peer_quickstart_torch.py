"""The quick start as a plain PyTorch eager script: the peer of `python -m trainkit` in the end-to-end rows.

The same job as the digits_quickstart recipe: scikit-learn's digits read from the file scikit-learn bundles (as
trainkit reads them), the same stratified split and normalisation, small_cnn's layout, Adam with a one-epoch
linear warm-up then a cosine to 0 (one rate per step, as trainkit's schedule), an EMA of the weights and buffers
with decay 0.99 and warm-up ``min(d, (1 + n) / (10 + n))``, evaluation of the live and EMA weights after every
epoch on the validation split, a checkpoint (weights, optimizer, EMA) after every epoch plus the best one,
and the best one's live and EMA weights on the test split at the end. Prints
``first step at S s`` (from the process's start) and the final accuracies. Run it: ``python -m
bench.peer_quickstart_torch [--epochs N] [--out DIR]``.
"""
import argparse
import copy
import gzip
import importlib.util
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bench.peer_loop import fit, shuffled_batches
from bench.wall_breakdown import process_start


def digits():
    """(train images, train labels, validation images, validation labels, test images, test labels) as DigitsData
    makes them (NCHW float32, int64): per class, a seed-0 permutation's first 20 % test, the next 10 % validation."""
    (folder,) = importlib.util.find_spec("sklearn").submodule_search_locations
    with gzip.open(Path(folder) / "datasets" / "data" / "digits.csv.gz", "rt") as lines:
        data = np.loadtxt(lines, delimiter=",")
    images, labels = data[:, :-1].reshape(-1, 8, 8) / 16.0, data[:, -1].astype(np.int64)
    rng = np.random.default_rng(0)
    train, val, test = [], [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        count = min(len(members) - 1, max(1, round(0.2 * len(members))))
        val_count = min(len(members) - count - 1, max(1, round(0.1 * len(members))))
        test.append(members[:count])
        val.append(members[count:count + val_count])
        train.append(members[count + val_count:])
    train, val, test = (np.sort(np.concatenate(part)) for part in (train, val, test))
    mean, std = images[train].mean(), images[train].std()
    normalised = torch.from_numpy(((images - mean) / std).astype(np.float32)[:, None])
    labels = torch.from_numpy(labels)
    return normalised[train], labels[train], normalised[val], labels[val], normalised[test], labels[test]


def small_cnn(width: int = 16) -> nn.Module:
    layers, channels = [], 1
    for out, stride in ((width, 1), (width * 2, 2), (width * 4, 2)):
        layers += [nn.Conv2d(channels, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
        channels = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


def learning_rates(lr: float, total: int, warmup: int):
    steps = np.arange(total)
    t = np.clip((steps - warmup) / max(total - warmup - 1, 1), 0.0, 1.0)
    rates = lr * 0.5 * (1 + np.cos(math.pi * t))
    rates[:warmup] = lr * np.arange(1, warmup + 1) / warmup
    return rates.tolist()


@torch.no_grad()
def evaluate(model: nn.Module, images, labels, batch: int = 32):
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(labels), batch):
        logits = model(images[start:start + batch])
        loss += nn.functional.cross_entropy(logits, labels[start:start + batch], reduction="sum").item()
        correct += (logits.argmax(1) == labels[start:start + batch]).sum().item()
    model.train()
    return correct / len(labels), loss / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", default="peer_run")
    args = parser.parse_args()
    start = process_start()
    torch.manual_seed(0)
    train_x, train_y, val_x, val_y, test_x, test_y = digits()
    model = small_cnn()
    ema = copy.deepcopy(model)
    shadows = [t for t in list(ema.parameters()) + list(ema.buffers()) if t.is_floating_point()]
    values = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-8)
    steps_per_epoch = len(train_y) // 32
    rates = learning_rates(0.01, args.epochs * steps_per_epoch, steps_per_epoch)

    def ema_update(step: int) -> None:
        torch._foreach_lerp_(shadows, values, 1 - min(0.99, (1 + step) / (10 + step)))

    def validate() -> float:
        evaluate(ema, val_x, val_y)  # the EMA weights are evaluated too, every epoch
        return evaluate(model, val_x, val_y)[0]

    fit(model, optimizer, shuffled_batches(train_x, train_y, 32), args.epochs, rates, validate, Path(args.out),
        start, states={"ema": ema}, after_step=ema_update)
    test, ema_test = evaluate(model, test_x, test_y)[0], evaluate(ema, test_x, test_y)[0]
    print(f"test: accuracy {test:.4f}, ema_accuracy {ema_test:.4f}")


if __name__ == "__main__":
    main()
