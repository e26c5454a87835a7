"""`python -m bench [--smoke] [--rows 1,4] [--out results]`: run the benchmarks, print the table, write results/.

Every ratio is measured side by side in one process (except row 7, one process per side), the sides alternating
over the repetitions, after a compiling first step and warm-up steps that are not counted. `--smoke` (or
TRAINKIT_BENCH_SMOKE=1) runs every row on tiny settings in a minute or two: it proves the command works and says
nothing about speed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import List

from trainkit.process import protobuf_backend

protobuf_backend.choose_upb()  # as python -m trainkit: row 4's app writes its records as the command does

import mindspore as ms  # noqa: E402

from bench.common import Row, Settings, environment

#: Benchmark modules and the rows each produces.
MODULES = {
    "wrapper_overhead": ("1", "2", "3", "8"),
    "peer_features": ("2", "3"),
    "app_overhead": ("4",),
    "pipeline": ("5",),
    "conv_impl": ("6", "9"),
    "memory": ("7",),
    "kernel_passes": ("10",),
    "end_to_end": ("11",),
    "ported_zoo": ("12",),
}


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", default=os.environ.get("TRAINKIT_BENCH_SMOKE") == "1",
                        help="tiny settings: check that every row runs (the test suite's smoke test)")
    parser.add_argument("--rows", default="", help="comma-separated rows to run, e.g. 1,4 (default: all)")
    parser.add_argument("--out", default="results", help="folder for bench.json and bench.md (default: results)")
    args = parser.parse_args(argv)
    wanted = {r.strip() for r in args.rows.split(",") if r.strip()}
    settings = Settings.smoke_test() if args.smoke else Settings.full()

    ms.set_context(mode=ms.GRAPH_MODE)
    env = environment()
    print(f"trainkit bench ({'smoke' if settings.smoke else 'full'}): " + ", ".join(f"{k} {v}" for k, v in env.items()),
          flush=True)
    start = time.perf_counter()
    rows: List[Row] = []
    failed = False
    for module_name, module_rows in MODULES.items():
        if wanted and not wanted.intersection(module_rows):
            continue
        print(f"-- rows {', '.join(module_rows)} ({module_name}) ...", flush=True)
        module_start = time.perf_counter()
        try:
            module = __import__(f"bench.{module_name}", fromlist=["run"])
            produced = module.run(settings)
        except Exception as error:  # noqa: BLE001 -- one broken row must not hide the others
            traceback.print_exc()
            failed = True
            produced = [Row(r, f"{module_name} failed", None, "", details=f"{type(error).__name__}: {error}")
                        for r in module_rows]
        rows.extend(r for r in produced if not wanted or r.row in wanted)
        print(f"   done in {time.perf_counter() - module_start:.0f} s", flush=True)
    rows.sort(key=lambda r: int(r.row))
    seconds = time.perf_counter() - start
    env["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    from bench.report import text_table, write

    print(text_table(rows))
    for path in write(rows, env, seconds, Path(args.out)):
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
