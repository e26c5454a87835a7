"""Two source trees' `bench.wall_breakdown`, second runs, taking turns: where one tree's change moved the seconds.

``python -m bench.breakdown_ab REPS TREE_A TREE_B [override ...]`` (a tree: a checkout or ``git archive`` of one).
Each tree runs once first to fill its own compile cache (a folder under the system's temporary directory), then
REPS times in alternating order, each run a new process with ``PYTHONPATH=TREE``. Prints every phase's median per
tree, the whole process's wall and CPU seconds, the pair ratios B/A and the load average. Nothing is asserted.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

LINE = re.compile(r"whole process ([0-9.]+) s \(([0-9.]+) s CPU\), first step at ([0-9.]+) s, exit status (\d+), "
                  r"load average ([0-9. ]+)")


def one(tree: str, cache: Path, run_dir: Path, argv: List[str]) -> Tuple[Dict[str, float], str]:
    env = {**os.environ, "PYTHONPATH": tree, "GLOG_v": "3", "TRAINKIT_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "bench.wall_breakdown", *argv, f"hydra.run.dir={run_dir}"],
                          cwd=tree, env=env, capture_output=True, text=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    found = LINE.search(done.stderr)
    if found is None or found.group(4) != "0":
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-3000:]}")
    phases = {name: float(value) for value, name in re.findall(r"^\s*([0-9.]+) s\s+[0-9.]+ %\s+(.*)$", done.stderr,
                                                                re.M)}
    phases.update({"whole process": float(found.group(1)), "CPU": float(found.group(2)),
                   "first step at": float(found.group(3))})
    return phases, found.group(5).strip()


def main(argv: List[str]) -> int:
    reps, trees, overrides = int(argv[0]), [str(Path(t).resolve()) for t in argv[1:3]], argv[3:]
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        caches = {tree: work / f"cache{i}" for i, tree in enumerate(trees)}
        results: Dict[str, List[Dict[str, float]]] = {tree: [] for tree in trees}
        loads = []
        for tree in trees:
            one(tree, caches[tree], work / "run", overrides)
        for rep in range(reps):
            for tree in trees if rep % 2 == 0 else trees[::-1]:
                phases, load = one(tree, caches[tree], work / "run", overrides)
                results[tree].append(phases)
                loads.append(load)
                print(f"{rep} {tree}: {phases['whole process']:.2f} s ({phases['CPU']:.2f} s CPU), load {load}",
                      flush=True)
    names = list(dict.fromkeys(name for tree in trees for phases in results[tree] for name in phases))
    print(f"{'phase (medians, seconds)':64s} {'A':>8s} {'B':>8s}")
    for name in names:
        a, b = (statistics.median(phases.get(name, 0.0) for phases in results[tree]) for tree in trees)
        print(f"{name[:64]:64s} {a:8.2f} {b:8.2f}")
    for key in ("whole process", "CPU"):
        ratios = [b[key] / a[key] for a, b in zip(*(results[tree] for tree in trees))]
        print(f"B/A {key}: {' '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})")
    print(f"load average (1, 5, 15 min): first {loads[0]}, last {loads[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
