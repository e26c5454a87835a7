"""Training speed by family: one torchvision model of each family in the zoo, ported by `trainkit.port` and built by
the app, against PyTorch eager on the same torchvision model.

`python -m bench.family_speed [--families resnet,vit] [--out results] [--smoke]`

Each family is measured on its own, in this one process, and freed before the next: the ported network's training
step (`TrainingWrapper`, SGD momentum, `model.conv_impl=auto`) and PyTorch eager's step (`torch.optim.SGD`,
`CrossEntropyLoss`), both on one fixed batch, the two sides alternating over the repetitions (`alternate_blocks`)
after a compiling first step and uncounted warm-up steps. Samples per step are equal, so the ratio of samples/s is
the inverse ratio of step times; each row gives the median of the paired ratios, their spread, and the load average
over the row. Small images (32x32, batch 32) for every family; ResNet-50 and ViT-B/16 also at 224x224 with a small
batch. The table goes to `results/family_speed.{json,md}`, and with `--docs` into docs/coming-from-pytorch.md
between its marker comments (`--docs` alone, with no families, copies the last results into the page).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

from trainkit.process import protobuf_backend

protobuf_backend.choose_upb()

import mindspore as ms  # noqa: E402

from bench.common import alternate_blocks, environment, median_ms, ratio, threads  # noqa: E402
from bench.ported_zoo import CLASSES, EagerStep, app_step, import_torchvision  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Family:
    """One row: a family, the torchvision model that stands for it, and the conditions it is measured under."""

    family: str
    model: str
    image: int = 32
    batch: int = 32
    steps: int = 2  # steps per timed repetition
    arguments: Dict[str, object] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.model}@{self.image}"


FAMILIES = [
    Family("ResNet", "resnet18"),
    Family("ResNeXt", "resnext50_32x4d", steps=1),
    Family("VGG", "vgg11_bn", steps=1),
    Family("DenseNet", "densenet121", steps=1),
    Family("MobileNetV2", "mobilenet_v2"),
    Family("MobileNetV3", "mobilenet_v3_small"),
    Family("EfficientNet", "efficientnet_b0"),
    Family("RegNet", "regnet_y_400mf"),
    Family("ShuffleNet", "shufflenet_v2_x1_0"),
    Family("ConvNeXt", "convnext_tiny", steps=1),
    Family("ViT", "vit_b_16", steps=1, arguments={"image_size": 32}),
    Family("Swin", "swin_t", steps=1),
    Family("ResNet", "resnet50", image=224, batch=8, steps=1),
    Family("ViT", "vit_b_16", image=224, batch=8, steps=1, arguments={"image_size": 224}),
]


def family_model(name: str, num_classes: int = CLASSES, **arguments):
    """torchvision.models.`name`(num_classes=..., **arguments): the port's target and PyTorch's side."""
    return getattr(import_torchvision().models, name)(num_classes=num_classes, **arguments)


def port_family(family: Family, folder: Path) -> str:
    """Port `family`'s model into `folder`; the ported class's `_target_`."""
    import importlib

    from omegaconf import OmegaConf

    from trainkit.bridge.port import port

    name = f"tv_{family.model}_{family.image}"
    out = folder / name
    port("bench.family_speed:family_model", {"name": family.model, **family.arguments}, out,
         [3, family.image, family.image])
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    config = OmegaConf.load(next((out / "conf" / "model").glob("*.yaml")))
    return str(config._target_)


@dataclasses.dataclass
class Settings:
    conv_impl: str = "auto"
    reps: int = 5
    warmup: int = 2
    smoke: bool = False


def measure(family: Family, folder: Path, settings: Settings) -> Dict[str, object]:
    """One family's row: both sides built, alternated, and freed."""
    import torch

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    target = port_family(family, folder)
    ported_seconds = time.perf_counter() - started
    row_settings = _StepSettings(batch=family.batch, image=family.image, warmup=settings.warmup)
    mindspore_step = app_step({"_target_": target, "conv_impl": settings.conv_impl}, row_settings)
    torch.set_num_threads(threads())
    torch.manual_seed(0)
    eager = EagerStep(family_model(family.model, **family.arguments), family.batch, family.image)
    for _ in range(1 + settings.warmup):
        eager.step()
    steps = family.steps
    seconds = alternate_blocks({
        "mindspore": {"trainkit": mindspore_step.run(steps)},
        "torch": {"pytorch": lambda: [eager.step() for _ in range(steps)]},
    }, settings.reps)
    value, spread = ratio(seconds, "pytorch", "trainkit")  # samples/s ratio: PyTorch's time over trainkit's
    return {
        "family": family.family, "model": family.model, "image": family.image, "batch": family.batch,
        "trainkit_ms": median_ms(seconds["trainkit"], steps), "pytorch_ms": median_ms(seconds["pytorch"], steps),
        "ratio": round(value, 3), "spread": spread, "compile_s": round(mindspore_step.compile_seconds, 1),
        "port_s": round(ported_seconds, 1), "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "error": "",
    }


@dataclasses.dataclass
class _StepSettings:
    """What `bench.ported_zoo.app_step` reads of the bench's settings."""

    batch: int
    image: int
    warmup: int


def markdown(rows: List[Dict[str, object]], env: Dict[str, object]) -> str:
    lines = [
        "| family | model | image, batch | trainkit | PyTorch eager | trainkit / PyTorch samples/s | spread | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["error"]:
            lines.append(f"| {row['family']} | {row['model']} | {row['image']}, {row['batch']} | - | - | "
                         f"not measured: {row['error']} | | |")
            continue
        lines.append(f"| {row['family']} | {row['model']} | {row['image']}, {row['batch']} | {row['trainkit_ms']} | "
                     f"{row['pytorch_ms']} | **{row['ratio']:.2f}x** | {row['spread']} | "
                     f"{row['load'][0]}-{row['load'][1]} |")
    lines.append("")
    lines.append(f"Measured by `python -m bench.family_speed`: {env['cpu_count']} cores, {env['threads']} threads "
                 f"each side, MindSpore {env['mindspore']}, PyTorch {env.get('torch', '?')}, {env['time']}. "
                 "A ratio above 1 means trainkit trains faster.")
    return "\n".join(lines) + "\n"


DOC = Path(__file__).resolve().parent.parent / "docs" / "coming-from-pytorch.md"
BEGIN, END = "<!-- family-speed table: begin -->", "<!-- family-speed table: end -->"


def write_docs(text: str, path: Path = DOC) -> None:
    """Replace the page's table between its markers with `text`."""
    page = path.read_text()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def measure_apart(family: Family, folder: Path, args: argparse.Namespace) -> Dict[str, object]:
    """`measure` in a process of its own: a family that takes its process down (a crash in a kernel) gives a row
    that says so, and the next family starts in a clean process."""
    result = folder / f"{family.model}_{family.image}.json"
    command = [sys.executable, "-m", "bench.family_speed", "--one", f"{family.model}@{family.image}",
               "--conv-impl", args.conv_impl, "--out", str(result)] + (["--smoke"] if args.smoke else [])
    process = subprocess.run(command, stdout=None, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(process.stderr[-4000:])
    if process.returncode == 0 and result.is_file():
        return json.loads(result.read_text())
    last = [line for line in process.stderr.splitlines() if line.strip() and not line.startswith("[WARNING]")]
    why = f"signal {-process.returncode}" if process.returncode < 0 else f"exit {process.returncode}"
    return {"family": family.family, "model": family.model, "image": family.image, "batch": family.batch,
            "error": f"the process ended ({why}): " + (last[-1][:160] if last else "no message")}


def measure_one(key: str, out: Path, settings: Settings) -> int:
    """The child's side of `measure_apart`: one family's row, or its error, as JSON in `out`."""
    family = next(f for f in FAMILIES if f.key == key)
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-family-") as folder:
        try:
            row = measure(family, Path(folder), settings)
        except Exception as error:  # noqa: BLE001 -- one family's failure is its row, not the table's end
            traceback.print_exc()
            row = {"family": family.family, "model": family.model, "image": family.image, "batch": family.batch,
                   "error": f"{type(error).__name__}: " + " ".join(str(error).split())[:160]}
    out.write_text(json.dumps(row))
    sys.stdout.flush()
    os._exit(0)  # the row is written: MindSpore's teardown at exit is not part of the measurement


def merged_rows(path: Path, families: List[Family]) -> List[Dict[str, object]]:
    """The rows of an earlier run in `path` that this run does not measure again."""
    if not path.is_file():
        return []
    measured = {(f.model, f.image) for f in families}
    known = {(f.model, f.image) for f in FAMILIES}
    return [r for r in json.loads(path.read_text())["rows"]
            if (r["model"], r["image"]) in known and (r["model"], r["image"]) not in measured]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.family_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="", help="comma-separated models or families (default: all)")
    parser.add_argument("--out", default="results", help="folder for family_speed.json and .md")
    parser.add_argument("--smoke", action="store_true", help="one repetition, no warm-up: proves the rows run")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/coming-from-pytorch.md "
                        "(alone: the last results in --out)")
    parser.add_argument("--conv-impl", default="auto", help="model.conv_impl of the ported networks (default auto)")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # MODEL@IMAGE: measure_apart's child
    args = parser.parse_args(argv)
    if args.docs and not args.families and (Path(args.out) / "family_speed.json").is_file():
        stored = json.loads((Path(args.out) / "family_speed.json").read_text())
        write_docs(markdown(stored["rows"], stored["environment"]))
        return 0
    wanted = {w.strip().lower() for w in args.families.split(",") if w.strip()}
    families = [f for f in FAMILIES if not wanted or f.family.lower() in wanted or f.model in wanted]
    settings = Settings(args.conv_impl, reps=1, warmup=0, smoke=True) if args.smoke else \
        Settings(args.conv_impl)
    ms.set_context(mode=ms.GRAPH_MODE)
    if args.one:
        return measure_one(args.one, Path(args.out), settings)
    import torch

    env = {**environment(), "torch": torch.__version__}
    print("family speed: " + ", ".join(f"{k} {v}" for k, v in env.items()), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = merged_rows(out / "family_speed.json", families) if not settings.smoke else []
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-family-") as folder:
        for family in families:
            print(f"-- {family.family}: {family.model} at {family.image}x{family.image}, batch {family.batch}",
                  flush=True)
            row = measure_apart(family, Path(folder), args)
            print(f"   {row}", flush=True)
            rows = [r for r in rows if (r["model"], r["image"]) != (family.model, family.image)] + [row]
            rows.sort(key=lambda r: next(i for i, f in enumerate(FAMILIES) if (f.model, f.image) ==
                                         (r["model"], r["image"])))
            # written after each row: a family that takes the process down leaves the others' rows
            (out / "family_speed.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
            (out / "family_speed.md").write_text(markdown(rows, env))
            gc.collect()
    print(markdown(rows, env))
    if args.docs:
        write_docs(markdown(rows, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
