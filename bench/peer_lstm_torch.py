"""The digits_lstm recipe as a plain PyTorch eager script: its peer in the end-to-end rows.

The same job as ``python -m trainkit recipe=digits_lstm``: the digits split and normalised as DigitsData does
(``bench.peer_quickstart_torch.digits``), each 8x8 image read row by row by an LSTM of 64 (PyTorch's
``nn.LSTM``, the layout trainkit's RowLSTM shares), a Dense head on the last hidden state, Adam (lr 0.01) with a
one-epoch linear warm-up then a cosine, global-norm clipping at 1.0, 10 epochs of batches of 32, the validation
split evaluated every epoch, a checkpoint after every epoch plus the best one, and the best one on the test split
at the end. Prints ``first step at S s`` (from the process's start). Run it: ``python -m bench.peer_lstm_torch
[--epochs N] [--out DIR]``.
"""
import argparse
from pathlib import Path

import torch
from torch import nn

from bench.peer_loop import fit, shuffled_batches
from bench.peer_quickstart_torch import digits, evaluate, learning_rates
from bench.wall_breakdown import process_start


class RowLSTM(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, images):
        outputs, _ = self.lstm(images.reshape(images.shape[0], 8, 8))  # one row of 8 pixels per step
        return self.head(outputs[:, -1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--out", default="peer_run")
    args = parser.parse_args()
    start = process_start()
    torch.manual_seed(0)
    train_x, train_y, val_x, val_y, test_x, test_y = digits()
    model = RowLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-8)
    steps_per_epoch = len(train_y) // 32
    rates = learning_rates(0.01, args.epochs * steps_per_epoch, steps_per_epoch)
    fit(model, optimizer, shuffled_batches(train_x, train_y, 32), args.epochs, rates,
        lambda: evaluate(model, val_x, val_y)[0], Path(args.out), start, clip=1.0)
    print(f"test_accuracy {evaluate(model, test_x, test_y)[0]:.4f}")


if __name__ == "__main__":
    main()
