"""Row 7: peak resident memory with EMA and accumulation on against off, each in its own process."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import List

from bench.common import Row, Settings, setup

MODEL = "resnet18"


def probe(features_on: bool, batch: int, image: int) -> None:
    """Run in a child: build, train three steps, print parameter bytes and peak RSS as JSON."""
    import mindspore as ms
    from mindspore import nn

    from bench.common import batch_tensors, loss_network
    from trainkit import TrainingWrapper
    from trainkit.models import resnet18

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    backbone = resnet18(num_classes=10)
    optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)
    extra = {"ema_decay": 0.999, "accumulation_steps": 2} if features_on else {}
    wrapper = TrainingWrapper(loss_network(backbone), optimizer, **extra)
    wrapper.set_train()
    inputs = batch_tensors(batch, 3, image)
    for _ in range(3):
        wrapper(*inputs)[0].asnumpy()
    parameter_bytes = sum(p.data.nbytes for p in backbone.trainable_params())
    print(json.dumps({"peak_bytes": peak_rss(), "parameter_bytes": parameter_bytes}))


def peak_rss() -> int:
    """This process's peak resident set in bytes.

    VmHWM from /proc where there is one: `ru_maxrss` survives `execve`, so a child would report its parent's peak.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(features_on: bool, batch: int, image: int) -> dict:
    command = [sys.executable, "-m", "bench.memory", "1" if features_on else "0", str(batch), str(image)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ, "GLOG_v": "3"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(settings: Settings) -> List[Row]:
    reps = max(2, settings.reps // 2)
    peaks = {True: [], False: []}
    parameter_bytes = 0
    for rep in range(reps):
        for on in ((False, True) if rep % 2 == 0 else (True, False)):
            result = _child(on, settings.batch, settings.image)
            peaks[on].append(result["peak_bytes"])
            parameter_bytes = result["parameter_bytes"]
    extra = [a - b for a, b in zip(peaks[True], peaks[False])]
    extra.sort()
    median_extra = extra[len(extra) // 2]
    expected = 2 * parameter_bytes  # the EMA shadows and the _grad_sum buffer
    mib = 1024 ** 2
    name = "peak RSS, EMA + accumulation on - off, in copies of the parameters"
    spread = f"{min(extra) / mib:.0f}-{max(extra) / mib:.0f} MiB over {reps} pairs"
    return [Row("7", name, median_extra / parameter_bytes, "copies", "expected 2", None, spread,
                f"on {sorted(peaks[True])[reps // 2] / mib:.0f} MiB, off {sorted(peaks[False])[reps // 2] / mib:.0f} "
                f"MiB, difference {median_extra / mib:.0f} MiB, expected {expected / mib:.0f} MiB "
                f"(2 x {parameter_bytes / mib:.1f} MiB of parameters)",
                setup(MODEL, settings.batch, settings.image, ema_decay=0.999, accumulation_steps=2))]


if __name__ == "__main__":
    probe(sys.argv[1] == "1", int(sys.argv[2]), int(sys.argv[3]))
