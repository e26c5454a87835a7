"""predict's speed on the digits: one input a network call (``--batch-size 1``), predict as another checkout has
it (``--before TREE``: a worktree of an earlier commit) and predict as this tree has it, side by side in one run.

    python -m bench.predict_speed [--inputs 5000] [--repeats 3] [--run RUN_DIR] [--before TREE] [--out FILE]

A digits run is trained first (the quick-start recipe, one epoch) unless ``--run`` names one. The inputs are a
``.npy`` of ``--inputs`` digits (scikit-learn's 1,797, repeated). Each side runs in a fresh process, as the command
does (its graph compiles there, once), the sides alternating over ``--repeats``; a side reports

* ``predict``: inputs / seconds from the network loaded to the CSV renamed into place (reading, preparing,
  network calls with their compile, softmax, rows, CSV): the rate predict's progress line shows;
* ``CPU``: inputs / CPU seconds of the same (every thread of the process): less moved by other work on a shared
  machine than wall time;
* ``whole process``: inputs / wall seconds, and / CPU seconds, of the whole process (imports and loading
  included: a fixed cost whatever the input count).

Both sides write the same CSV (checked here: the predicted classes equal, probabilities within 1e-6).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


# One side, in a fresh process with the side's tree on PYTHONPATH: load as the command loads, then time predict
# writing its CSV; prints JSON. (Code run by ``python -c``: the tree's trainkit, not this file's.)
CHILD = """
import json, sys, time
from pathlib import Path
from trainkit.tool_command import importing
with importing("__main__"):  # as python -m trainkit.predict imports (protobuf's C backend, the start-up frozen)
    from trainkit.tools import predict as tool
    from trainkit.tools.inference import load_trained
run, inputs, out = sys.argv[1:4]
batch_size = int(sys.argv[5]) if len(sys.argv) > 5 else None
start = time.perf_counter()
trained = load_trained(Path(run), work_dir=Path(out).parent)
names = tool.class_names(trained)
loaded, cpu = time.perf_counter(), time.process_time()
counts = tool.write_csv(Path(out), lambda write_row: tool.predict(trained, [inputs], write_row,
                                                                    batch_size=batch_size, names=names or []))
done = time.perf_counter()
print(json.dumps({"load": loaded - start, "predict": done - loaded, "inputs": counts.predicted,
                  "cpu": time.process_time() - cpu}))
"""


def train_run(folder: Path) -> Path:
    """The quick-start recipe, one epoch, through the command (as a user's run)."""
    run = folder / "run"
    subprocess.run([sys.executable, "-m", "trainkit", f"run_dir={run}", "trainer.epochs=1", "logger.progress=off",
                    "logger.tensorboard=false", "trainer.test=false"], check=True, cwd=ROOT, env=_env(),
                   stdout=subprocess.DEVNULL)
    return run


def _env(tree: Path = ROOT) -> Dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "GLOG_v": "3"}


def _commit(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "?") + (" + changes" if dirty else "")


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
    parser.add_argument("--before", type=Path, default=None, metavar="TREE", help="a checkout whose trainkit "
                        "predicts as the 'before' side (e.g. git worktree add /tmp/before main)")
    parser.add_argument("--out", type=Path, default=None, help="append the markdown table to this file")
    args = parser.parse_args(argv)
    sides = {"one input a call (--batch-size 1)": (ROOT, ["--batch-size", "1"])}
    if args.before is not None:
        sides[f"before ({_commit(args.before)}, default batches)"] = (args.before.resolve(), [])
    sides[f"this tree ({_commit(ROOT)}, default batches)"] = (ROOT, [])
    found: Dict[str, Dict[str, List[float]]] = {side: {"predict": [], "cpu": [], "process": [], "process CPU": []}
                                                  for side in sides}
    with tempfile.TemporaryDirectory(prefix="predict_speed_") as folder:
        folder = Path(folder)
        run = args.run or train_run(folder)
        inputs = digits(args.inputs, folder / "digits.npy")
        tables = {}
        for repeat in range(args.repeats):
            for number, (side, (tree, extra)) in enumerate(sides.items()):
                out = folder / f"{number}-{repeat}.csv"
                start, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run([sys.executable, "-c", CHILD, str(run), str(inputs), str(out),
                                       *extra], check=True, cwd=ROOT, env=_env(tree),
                                      capture_output=True, text=True)
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                process_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                assert result["inputs"] == args.inputs, result
                found[side]["predict"].append(args.inputs / result["predict"])
                found[side]["cpu"].append(args.inputs / result["cpu"])
                found[side]["process"].append(args.inputs / wall)
                found[side]["process CPU"].append(args.inputs / process_cpu)
                tables[side] = _rows(out)
                print(f"repeat {repeat} {side}: predict {result['predict']:.2f} s ({result['cpu']:.2f} s of CPU), "
                      f"load {result['load']:.2f} s, process {wall:.2f} s ({process_cpu:.2f} s of CPU)", flush=True)
        reference = next(iter(tables.values()))
        for table in tables.values():  # the same predictions on every side
            assert (table.argmax(1) == reference.argmax(1)).all() and np.abs(table - reference).max() <= 1e-6
    medians = {side: {key: statistics.median(values) for key, values in rates.items()}
               for side, rates in found.items()}
    base = next(iter(medians.values()))
    lines = [f"predict on {args.inputs} digits (.npy), median of {args.repeats}, sides alternating, each in a fresh "
             f"process; load average {os.getloadavg()[0]:.1f} at the end:", "",
             "| side | predict: inputs/s | x one a call | inputs / CPU s | x one a call | whole process: inputs/s "
             "| x one a call | inputs / CPU s | x one a call |", "|---|---|---|---|---|---|---|---|---|"]
    for side, rate in medians.items():
        lines.append(" | ".join([f"| {side}"] + [f"{rate[key]:.0f} | {rate[key] / base[key]:.1f}"
                                                 for key in ("predict", "cpu", "process", "process CPU")]) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a", encoding="utf-8") as handle:
            handle.write(text + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
