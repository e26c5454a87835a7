"""The wine_mlp recipe as a plain PyTorch eager script: its peer in the end-to-end rows.

The same job as ``python -m trainkit recipe=wine_mlp``: scikit-learn's wine data split as trainkit's tabular
data module splits it (``train_test_split`` with the same fractions, seed and stratification: the same rows),
features standardised with the training rows' statistics, an MLP 13 -> 32 -> ReLU -> 3, Adam (lr 0.01) with a
cosine to 0 over the run's updates, batches of 16 (the last incomplete one dropped), 20 epochs, the validation
set evaluated every 5 epochs, a checkpoint (weights and optimizer) after every epoch plus the best one, and the
best checkpoint evaluated on the test set at the end. Prints ``first step at S s`` (from the process's start).
Run it: ``python -m bench.peer_wine_torch [--epochs N] [--out DIR]``.
"""
import argparse
import math
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_wine
from sklearn.model_selection import train_test_split
from torch import nn

from bench.peer_loop import fit, shuffled_batches
from bench.wall_breakdown import process_start


def wine(test_fraction: float = 0.2, val_fraction: float = 0.1, seed: int = 0):
    """(train, val, test) pairs of float32 features and int64 labels, as SklearnTabularData makes them."""
    features, target = load_wine(return_X_y=True)
    train_x, test_x, train_y, test_y = train_test_split(features, target, test_size=test_fraction,
                                                        random_state=seed, stratify=target)
    train_x, val_x, train_y, val_y = train_test_split(train_x, train_y, test_size=val_fraction / (1 - test_fraction),
                                                      random_state=seed, stratify=train_y)
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)
    std[std == 0] = 1.0

    def tensors(x, y):
        return torch.from_numpy(((x - mean) / std).astype(np.float32)), torch.from_numpy(y.astype(np.int64))

    return tensors(train_x, train_y), tensors(val_x, val_y), tensors(test_x, test_y)


@torch.no_grad()
def evaluate(model: nn.Module, x, y):
    logits = model(x)
    return (logits.argmax(1) == y).float().mean().item(), nn.functional.cross_entropy(logits, y).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--out", default="peer_run")
    args = parser.parse_args()
    start = process_start()
    torch.manual_seed(0)
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = wine()
    model = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-8)
    batch_size = 16  # data=wine's batch_size
    total = args.epochs * (len(train_y) // batch_size)
    rates = [0.01 * 0.5 * (1 + math.cos(math.pi * min(step / max(total - 1, 1), 1.0))) for step in range(total)]
    fit(model, optimizer, shuffled_batches(train_x, train_y, batch_size), args.epochs, rates,
        lambda: evaluate(model, val_x, val_y)[0], Path(args.out), start, eval_every=args.eval_every)
    test_accuracy, test_loss = evaluate(model, test_x, test_y)
    print(f"test_accuracy {test_accuracy:.4f}, test_loss {test_loss:.4f}")


if __name__ == "__main__":
    main()
