"""predict's speed on the digits: one input a network call (``--batch-size 1``, what predict did before it
batched) against its default batches, side by side in one run.

    python -m bench.predict_speed [--inputs 5000] [--repeats 3] [--run RUN_DIR] [--out results/predict_speed.md]

A digits run is trained first (the quick-start recipe, one epoch) unless ``--run`` names one. The inputs are a
``.npy`` of ``--inputs`` digits (scikit-learn's 1,797, repeated). Each side runs in a fresh process, as the command
does (its graph compiles there, once), the sides alternating over ``--repeats``; a side reports

* ``predict``: inputs / seconds from the network loaded to the CSV renamed into place (reading, preparing,
  network calls with their compile, softmax, rows, CSV): the rate predict's progress line shows;
* ``command``: inputs / wall seconds of the whole ``python -m trainkit.predict`` process (imports and loading
  included, a fixed cost of a few seconds whatever the input count).

Both sides write the same CSV (checked here: the predicted classes equal, probabilities within 1e-6).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIDES = {"one input a call (--batch-size 1)": ["--batch-size", "1"], "batched (default)": []}


def child(run: str, inputs: str, out: str, extra: List[str]) -> None:
    """One side, in this process: load as the command loads, then time predict writing its CSV; prints JSON."""
    from trainkit.tools import predict as tool
    from trainkit.tools.inference import load_trained

    batch_size = int(extra[1]) if extra else None
    start = time.perf_counter()
    trained = load_trained(Path(run), work_dir=Path(out).parent)
    names = tool.class_names(trained)
    loaded = time.perf_counter()
    counts = tool.write_csv(Path(out), lambda write_row: tool.predict(trained, [inputs], write_row,
                                                                        batch_size=batch_size, names=names or []))
    done = time.perf_counter()
    print(json.dumps({"load": loaded - start, "predict": done - loaded, "inputs": counts.predicted}))


def train_run(folder: Path) -> Path:
    """The quick-start recipe, one epoch, through the command (as a user's run)."""
    run = folder / "run"
    subprocess.run([sys.executable, "-m", "trainkit", f"run_dir={run}", "trainer.epochs=1", "logger.progress=off",
                    "logger.tensorboard=false", "trainer.test=false"], check=True, cwd=ROOT, env=_env(),
                   stdout=subprocess.DEVNULL)
    return run


def _env() -> Dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}


def digits(count: int, path: Path) -> Path:
    from trainkit.data.digits import load_digits_arrays

    raw, _ = load_digits_arrays()
    rows = raw.reshape(len(raw), 64)
    np.save(path, np.resize(rows, (count, 64)))
    return path


def _rows(path: Path) -> np.ndarray:
    """Each CSV row's probabilities in class order."""
    with path.open(encoding="utf-8") as handle:
        rows = list(csv.reader(handle))[1:]
    table = np.zeros((len(rows), 10))
    for index, row in enumerate(rows):
        for rank in range(1, len(row) // 2 + 1):
            table[index, int(row[2 * rank - 1])] = float(row[2 * rank])
    return table


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.predict_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run", type=Path, default=None, help="a digits run directory (default: train one)")
    parser.add_argument("--out", type=Path, default=None, help="append the markdown row to this file")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.child[2], args.child[3:])
        return 0
    with tempfile.TemporaryDirectory(prefix="predict_speed_") as folder:
        folder = Path(folder)
        run = args.run or train_run(folder)
        inputs = digits(args.inputs, folder / "digits.npy")
        found: Dict[str, Dict[str, List[float]]] = {side: {"predict": [], "command": []} for side in SIDES}
        tables = {}
        for repeat in range(args.repeats):
            for side, extra in SIDES.items():
                out = folder / f"{len(tables)}.csv"
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "bench.predict_speed", "--child", str(run), str(inputs),
                                       str(out), *extra], check=True, cwd=ROOT, env=_env(), capture_output=True,
                                      text=True)
                wall = time.perf_counter() - start
                result = json.loads(done.stdout.strip().splitlines()[-1])
                assert result["inputs"] == args.inputs, result
                found[side]["predict"].append(args.inputs / result["predict"])
                found[side]["command"].append(args.inputs / wall)
                tables[side] = _rows(out)
                print(f"repeat {repeat} {side}: predict {result['predict']:.2f} s, load {result['load']:.2f} s, "
                      f"command {wall:.2f} s", flush=True)
        first, second = list(tables.values())
        assert (first.argmax(1) == second.argmax(1)).all() and np.abs(first - second).max() <= 1e-6
    before, after = (found[side] for side in SIDES)
    medians = {side: {key: statistics.median(values) for key, values in rates.items()}
               for side, rates in found.items()}
    lines = [f"predict on {args.inputs} digits (.npy), median of {args.repeats}, sides alternating, "
             f"load average {os.getloadavg()[0]:.1f}:", "",
             "| side | predict: inputs/s | whole command: inputs/s |", "|---|---|---|"]
    for side, rate in medians.items():
        lines.append(f"| {side} | {rate['predict']:.0f} | {rate['command']:.0f} |")
    ratio = statistics.median(after["predict"]) / statistics.median(before["predict"])
    ratio_command = statistics.median(after["command"]) / statistics.median(before["command"])
    lines.append(f"| ratio | {ratio:.1f}x | {ratio_command:.1f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a", encoding="utf-8") as handle:
            handle.write(text + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
