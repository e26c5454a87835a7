"""ResNet-50 on CIFAR-10 at 32x32 for a fixed number of steps, in plain PyTorch eager: the peer of
``python -m trainkit recipe=resnet50_cifar10 data.image_size=32`` in the end-to-end rows.

The same job on the same CIFAR-10 binary files (``--root``, written by ``bench.end_to_end``: the official format,
few records): the validation records chosen as ``Cifar10Data`` chooses them (``--val-fraction``, split seed 0:
the classes take turns in a seed-0 permutation), the rest trained on in batches of 32 with RandomCrop(32,
padding 4), a horizontal flip and the recipe's normalisation, torchvision's ResNet-50 layout
(``bench.torch_resnet``), Adam (lr 0.001, weight decay 1e-5), the validation records evaluated after each epoch,
a checkpoint every epoch and the best, and the best one on the test file at the end. Prints ``first step at S s``.
"""
import argparse
from pathlib import Path

import numpy as np
import torch

from bench.peer_loop import fit
from bench.torch_resnet import ResNet50
from bench.wall_breakdown import process_start

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.2023, 0.1994, 0.2010], np.float32).reshape(1, 3, 1, 1)


def records(paths):
    raw = np.concatenate([np.fromfile(p, dtype=np.uint8).reshape(-1, 3073) for p in paths])
    return raw[:, 1:].reshape(-1, 3, 32, 32), raw[:, 0].astype(np.int64)


def validation(labels: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(len(labels))
    turn = np.zeros(len(labels), dtype=np.int64)
    for label in np.unique(labels):
        members = np.flatnonzero(labels[order] == label)
        turn[members] = np.arange(len(members))
    return np.sort(order[np.argsort(turn, kind="stable")][:max(1, round(fraction * len(labels)))])


def normalised(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(((images.astype(np.float32) / 255.0 - MEAN) / STD).astype(np.float32))


def augmented(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    padded = np.pad(images, ((0, 0), (0, 0), (4, 4), (4, 4)))
    out = np.empty_like(images)
    for i, (dy, dx, flip) in enumerate(zip(rng.integers(0, 9, len(images)), rng.integers(0, 9, len(images)),
                                           rng.random(len(images)) < 0.5)):
        crop = padded[i, :, dy:dy + 32, dx:dx + 32]
        out[i] = crop[:, :, ::-1] if flip else crop
    return out


@torch.no_grad()
def evaluate(model, x, y, batch: int = 32):
    model.eval()
    correct = sum((model(x[s:s + batch]).argmax(1) == y[s:s + batch]).sum().item() for s in range(0, len(y), batch))
    model.train()
    return correct / len(y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--out", default="peer_run")
    args = parser.parse_args()
    start = process_start()
    torch.manual_seed(0)
    folder = Path(args.root) / "cifar-10-batches-bin"
    images, labels = records([folder / f"data_batch_{i}.bin" for i in range(1, 6)])
    test_images, test_labels = records([folder / "test_batch.bin"])
    val = validation(labels, args.val_fraction)
    train = np.setdiff1d(np.arange(len(labels)), val)
    val_x, val_y = normalised(images[val]), torch.from_numpy(labels[val])
    model = ResNet50(num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, weight_decay=1e-5)
    rng = np.random.default_rng(0)

    def batches(epoch: int):  # a new order each epoch, each batch cropped and flipped at random
        order = rng.permutation(train)
        for index in range(len(train) // 32):
            batch = order[index * 32:(index + 1) * 32]
            yield normalised(augmented(images[batch], rng)), torch.from_numpy(labels[batch])

    fit(model, optimizer, batches, args.epochs, [], lambda: evaluate(model, val_x, val_y), Path(args.out), start)
    print(f"test_accuracy {evaluate(model, normalised(test_images), torch.from_numpy(test_labels)):.4f}")


if __name__ == "__main__":
    main()
