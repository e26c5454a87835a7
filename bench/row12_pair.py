"""Row 12's headline pair alone: the ported torchvision ResNet-18 step (built by the app) against PyTorch eager's,
alternating in one process, with the load average before and after. `python -m bench.row12_pair [reps] [steps]`.

Extra sides for A/B work: environment variable ROW12_SIDES="name=module:function,..." adds MindSpore steps built
by a function taking (target, settings) (used while trying cuts; the row itself is `python -m bench --rows 12`).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import mindspore as ms


def main(reps: int = 11, steps: int = 3) -> None:
    from bench.common import Settings, alternate_blocks
    from bench.ported_zoo import _eager, app_step, port_model

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    settings = Settings.full()
    settings.large_steps = steps
    print("load average at start", os.getloadavg(), flush=True)
    with tempfile.TemporaryDirectory(prefix="trainkit-row12-") as folder:
        target, _ = port_model("resnet18", Path(folder))
        sides = {"ported resnet18": app_step({"_target_": target}, settings).run(steps)}
        import torch
        torch_sides = {"torch resnet18": _eager("resnet18", False, settings)}
        print("torch threads", torch.get_num_threads(), "mindspore runtime_num_threads",
              ms.get_context("runtime_num_threads"), flush=True)
        seconds = alternate_blocks({"mindspore": sides, "torch": torch_sides}, reps)
    for name, values in seconds.items():
        print(f"{name}: median {statistics.median(values) / steps * 1000:.1f} ms/step "
              f"(min {min(values) / steps * 1000:.1f})")
    pairs = [t / m for t, m in zip(seconds["torch resnet18"], seconds["ported resnet18"])]
    print(f"ported / torch samples/s: median {statistics.median(pairs):.3f}x, pairs {min(pairs):.3f}-{max(pairs):.3f}")
    print("load average at end", os.getloadavg())


if __name__ == "__main__":
    main(*(int(value) for value in sys.argv[1:]))
