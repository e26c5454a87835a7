"""digits_lstm's training step, its LSTM written three ways, timed alternating in one process (issue 33).

`python -m bench.lstm_step [--reps 15] [--steps 30] [--profile DIR]`: RowLSTM as the recipe trains it (TrainingWrapper
with the app's defaults, Adam, clipping at 1.0; batch 32 of 8 rows of 8 pixels, hidden 64) with

* ``time_major``: ``trainkit.models.sequence.RowLSTM`` now (``nn.LSTM`` fed time-major: one Transpose);
* ``batch_first``: RowLSTM as it was (``nn.LSTM(batch_first=True)``: the images' transpose, then nn.LSTM's two);
* ``matmuls``: the LSTM written from MatMuls, the gates' weights as their own Parameters (PyTorch's names), one
  MatMul for every step's input projection and one a step for the recurrence.

Prints each side's median ms per step and its fastest repetition's (the least disturbed on a shared machine), the
ratios to ``time_major`` and the load average. With ``--profile`` it
also profiles ``batch_first`` and prints each kernel type's share of the kernel time (``Concat`` is nn.LSTM's
weight concatenation, ``LSTM``/``LSTMGrad`` MindSpore's CPU kernels).
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import statistics

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from bench.common import Stepper, alternate, batch_tensors, loss_network
from trainkit import TrainingWrapper
from trainkit.models.sequence import RowLSTM

HIDDEN = 64


class BatchFirstRowLSTM(RowLSTM):
    """RowLSTM before issue 33: batch-first, so nn.LSTM transposes its input and its outputs."""

    def __init__(self):
        super().__init__(num_classes=10, in_channels=1, row_size=8, hidden_size=HIDDEN)
        self.lstm = nn.LSTM(8, HIDDEN, batch_first=True)

    def construct(self, images):
        batch, channels, rows, width = images.shape
        steps = ops.transpose(images, (0, 2, 1, 3)).reshape(batch, rows, channels * width)
        outputs, _ = self.lstm(steps)
        return self.head(outputs[:, -1, :])


class MatMulLSTM(nn.Cell):
    """One LSTM layer from MatMuls (PyTorch's equations, gate order and parameter names), time-major."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        bound = 1 / np.sqrt(hidden_size)
        rng = np.random.default_rng(0)

        def uniform(*shape):
            return Tensor(rng.uniform(-bound, bound, shape).astype(np.float32))

        self.weight_ih_l0 = Parameter(uniform(4 * hidden_size, input_size), name="weight_ih_l0")
        self.weight_hh_l0 = Parameter(uniform(4 * hidden_size, hidden_size), name="weight_hh_l0")
        self.bias_ih_l0 = Parameter(uniform(4 * hidden_size), name="bias_ih_l0")
        self.bias_hh_l0 = Parameter(uniform(4 * hidden_size), name="bias_hh_l0")
        self.hidden_size = hidden_size
        self.matmul_t = ops.MatMul(transpose_b=True)

    def construct(self, steps):
        time_steps, batch, features = steps.shape
        projected = ops.bias_add(self.matmul_t(steps.reshape(time_steps * batch, features), self.weight_ih_l0),
                                 self.bias_ih_l0 + self.bias_hh_l0)
        projected = ops.unstack(projected.reshape(time_steps, batch, 4 * self.hidden_size), 0)
        h = ops.zeros((batch, self.hidden_size), ms.float32)
        c = ops.zeros((batch, self.hidden_size), ms.float32)
        for t in range(time_steps):
            gates = projected[t] + self.matmul_t(h, self.weight_hh_l0)
            i, f, _, o = ops.split(ops.sigmoid(gates), self.hidden_size, 1)
            g = ops.tanh(ops.split(gates, self.hidden_size, 1)[2])
            c = f * c + i * g
            h = o * ops.tanh(c)
        return h


class MatMulRowLSTM(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lstm = MatMulLSTM(8, HIDDEN)
        self.head = nn.Dense(HIDDEN, 10)

    def construct(self, images):
        batch, channels, rows, width = images.shape
        steps = ops.transpose(images, (2, 0, 1, 3)).reshape(rows, batch, channels * width)
        return self.head(self.lstm(steps))


def train_step(backbone: nn.Cell) -> nn.Cell:
    """The recipe's step: Adam 0.01, clipping at 1.0, the app's default guard and running totals."""
    optimizer = nn.Adam(backbone.trainable_params(), learning_rate=0.01)
    return TrainingWrapper(loss_network(backbone), optimizer, max_grad_norm=1.0, compute_grad_norm=True,
                           skip_nonfinite=True, metrics_on_device=True)


def kernel_shares(folder: str) -> dict:
    """Kernel type -> share of the kernel time, from the profiler's ``cpu_op_type_info_0.csv``."""
    [path] = glob.glob(os.path.join(folder, "**", "cpu_op_type_info_0.csv"), recursive=True)
    with open(path) as stream:
        rows = list(csv.DictReader(stream))
    total = sum(float(row["total_compute_time"]) for row in rows)
    return {row["op_type"]: float(row["total_compute_time"]) / total for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile", default=None, help="a folder: also profile batch_first's kernels")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    images, labels = batch_tensors(32, 1, 8)
    steppers = {"time_major": Stepper(train_step(RowLSTM(10, 1, 8, HIDDEN)), (images, labels), warmup=5),
                "batch_first": Stepper(train_step(BatchFirstRowLSTM()), (images, labels), warmup=5),
                "matmuls": Stepper(train_step(MatMulRowLSTM()), (images, labels), warmup=5)}
    seconds = alternate({name: stepper.run(args.steps) for name, stepper in steppers.items()}, args.reps)
    base = seconds["time_major"]
    for name, values in seconds.items():
        ratios = [a / b for a, b in zip(values, base)]
        print(f"{name:12s} {statistics.median(values) / args.steps * 1000:7.3f} ms/step (fastest repetition "
              f"{min(values) / args.steps * 1000:.3f})  x{statistics.median(ratios):.3f} of time_major "
              f"(spread {min(ratios):.3f}-{max(ratios):.3f}; fastest against fastest x{min(values) / min(base):.3f})")
    print(f"load average {os.getloadavg()}")
    if args.profile:
        for name in ("batch_first", "time_major"):
            profiler = ms.Profiler(output_path=os.path.join(args.profile, name))
            steppers[name].run(args.steps)()
            profiler.stop()
            profiler.analyse()
            shares = sorted(kernel_shares(os.path.join(args.profile, name)).items(), key=lambda kv: -kv[1])
            print(name, "kernel time:", ", ".join(f"{op} {100 * share:.1f}%" for op, share in shares[:8]))


if __name__ == "__main__":
    main()
