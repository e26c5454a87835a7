"""`python -m bench.checkpoint_transfer [--model resnet50] [--reps 3]`: the two ways a machine with its own run
directory can resume from rank 0's checkpoint (issue 34), timed on this host.

* send: machine 0's launcher sends the checkpoint once per resume over the launchers' connection
  (:mod:`trainkit.distributed.rendezvous`, the code the launcher runs; here over loopback TCP, two processes);
* keep: every machine writes its own copy at every save (timed as trainkit's durable checkpoint save of the same
  training cell: MindSpore's save, CRC, fsync).

The keep side pays one save per checkpoint on every machine for the whole run; the send side one transfer per
resume. Prints the size and the median seconds of each.
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import mindspore as ms
from mindspore import nn

from trainkit.distributed.launch import free_port
from trainkit.distributed.rendezvous import Meeting
from trainkit.models import resnet
from trainkit.rundir.checkpoint_file import Position, save_training_checkpoint


def _parallel(node_rank: int, port: int) -> SimpleNamespace:
    return SimpleNamespace(nodes=2, node_rank=node_rank, workers=1, master_addr="127.0.0.1", master_port=port,
                           join_timeout=60.0)


def _receiver(port: int, queue) -> None:
    meeting = Meeting(_parallel(1, port), {"node_rank": 1, "signature": {}})
    meeting.join()
    began = time.perf_counter()
    data = meeting.answer(True)
    queue.put((len(data), time.perf_counter() - began))
    meeting.close()


def time_send(payload: bytes) -> float:
    """Seconds from machine 1's request to the checkpoint's last byte in its memory."""
    port = free_port()
    queue = multiprocessing.get_context("spawn").Queue()
    receiver = multiprocessing.get_context("spawn").Process(target=_receiver, args=(port, queue))
    receiver.start()
    meeting = Meeting(_parallel(0, port), {"node_rank": 0, "signature": {}})
    meeting.gather()
    meeting.start({"job": "bench", "checkpoint": {"name": "x.ckpt"}}, payload)
    size, seconds = queue.get(timeout=120)
    receiver.join()
    meeting.close()
    assert size == len(payload)
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_transfer", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=["resnet18", "resnet50"])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    network = getattr(resnet, args.model)(num_classes=10)
    cell = nn.TrainOneStepCell(nn.WithLossCell(network, nn.SoftmaxCrossEntropyWithLogits(sparse=True)),
                               nn.Adam(network.trainable_params()))  # weights and Adam's two moments
    with tempfile.TemporaryDirectory() as folder:
        saves, sends = [], []
        for rep in range(args.reps):
            path = Path(folder) / f"trainkit-1_{rep + 1}.ckpt"
            began = time.perf_counter()
            save_training_checkpoint(cell, path, Position(rep + 1, 100), skipped_steps=0, group_size=2,
                                     config_text=None)
            saves.append(time.perf_counter() - began)
            sends.append(time_send(path.read_bytes()))
        size = path.stat().st_size
    print(f"{args.model} + Adam checkpoint, {size / 1e6:.1f} MB: keep a copy on every machine = one save per "
          f"checkpoint per machine, {statistics.median(saves):.3f} s each; send once per resume = "
          f"{statistics.median(sends):.3f} s (loopback TCP) [{ms.__version__}, {args.reps} reps]")


if __name__ == "__main__":
    main()
