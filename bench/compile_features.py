"""What each TrainingWrapper feature adds to ResNet-50's train-graph compile (row 8, feature by feature).

``python -m bench.compile_features [--reps 2] [--configs off,EMA] [--nodes]``: every configuration compiles in a
fresh process (the compile cache off, ``TRAINKIT_COMPILE_CACHE=0``), the configurations taking turns over the
repetitions (A B ..., then ... B A) so drifting load hits them alike. Per configuration it prints the median
seconds of ``cell.compile`` (the graph alone), of the first call after it and of a step after warm-up; with
``--nodes`` also the number of nodes in the graph MindSpore hands to its runtime (from ``MS_DEV_SAVE_GRAPHS``'
dump, in a process of its own: dumping slows the compile).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Configurations: TrainOneStepCell, the wrapper with everything off, one feature at a time, then row 8's "on" and
#: everything the wrapper has at once (accumulation aside: it adds a branch of its own, row 3).
CONFIGS = {
    "TrainOneStepCell": None,
    "off": {},
    "static loss scale": {"loss_scale": 1024.0},
    "dynamic loss scale": {"loss_scale": "dynamic"},
    "clipping": {"max_grad_norm": 1.0},
    "grad norm": {"compute_grad_norm": True},
    "guard": {"skip_nonfinite": True},
    "guard + grad norm": {"skip_nonfinite": True, "compute_grad_norm": True},
    "EMA": {"ema_decay": 0.999},
    "running totals": {"metrics_on_device": True},
    "row 8 on": {"loss_scale": "dynamic", "max_grad_norm": 1.0, "ema_decay": 0.999},
    "everything": {"loss_scale": "dynamic", "max_grad_norm": 1.0, "ema_decay": 0.999, "skip_nonfinite": True,
                   "compute_grad_norm": True, "metrics_on_device": True},
}


def _child(config: str, batch: int, image: int, steps: int) -> dict:
    """One configuration in this process: build, compile, first call, `steps` timed steps."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from trainkit import TrainingWrapper
    from trainkit.models import resnet50

    ms.set_context(mode=ms.GRAPH_MODE)
    if os.environ.get("TK_COMPILE_PROFILE") == "1":  # MindSpore prints its front end's time per pass
        from mindspore.graph._parse import compile_config
        compile_config.COMPILE_PROFILE = "1"
    ms.set_seed(0)
    backbone = resnet50(num_classes=10)
    loss = nn.WithLossCell(backbone, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)
    args = CONFIGS[config]
    if args is None:
        cell = nn.TrainOneStepCell(loss, optimizer)
    else:
        args = dict(args)
        if args.get("loss_scale") == "dynamic":
            args["loss_scale"] = ms.amp.DynamicLossScaler(2.0 ** 10, 2, 1000)
        cell = TrainingWrapper(loss, optimizer, **args)
    cell.set_train()
    rng = np.random.RandomState(0)
    inputs = (Tensor(rng.randn(batch, 3, image, image).astype(np.float32)),
              Tensor((np.arange(batch) % 10).astype(np.int32)))

    def step():
        out = cell(*inputs)
        return (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()

    start, cpu_start = time.perf_counter(), time.process_time()
    cell.compile(*inputs)
    compile_seconds, compile_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    # CPU seconds too: on a shared machine they vary far less than the wall time (the compile is mostly one thread).
    return {"config": config, "compile": compile_seconds, "compile_cpu": compile_cpu, "first": first,
            "step": statistics.median(times) if times else float("nan")}


def count_nodes(folder: str) -> dict:
    """Nodes in MindSpore's dumps: after inlining (05_inline: the front end's work), after the front end's
    optimizer (21_validate) and in the runtime's kernel graph (graph_build), with the kernel graph's commonest
    operators (Load/UpdateState/MakeTuple bookkeeping included)."""
    counts = {}
    files = list(Path(folder).rglob("*.ir"))
    for label, pattern in (("inline", r"^\d+_inline"), ("validate", r"^\d+_validate"), ("kernels", r"^graph_build")):
        matched = [p for p in files if re.search(pattern, p.name)]
        if matched:
            text = matched[0].read_text(errors="replace")
            counts[label] = len(re.findall(r"^  %\d+\(", text, re.M))
            if label == "kernels":
                ops = collections.Counter(re.findall(r"^  %\d+\([^)]*\) = ([A-Za-z_]+)", text, re.M))
                counts["top_ops"] = dict(ops.most_common(12))
    return counts


def _run_child(config: str, args, nodes: bool, tree: str = "") -> dict:
    """`config` compiled in a fresh process; `tree`: another checkout's root to import trainkit from (before/after)."""
    env = {**os.environ, "TRAINKIT_COMPILE_CACHE": "0", "GLOG_v": "3"}
    if tree:
        env["PYTHONPATH"] = tree
    folder = None
    if nodes:
        folder = tempfile.mkdtemp(prefix="tk_ir_")
        env.update(MS_DEV_SAVE_GRAPHS="1", MS_DEV_SAVE_GRAPHS_PATH=folder,
                   MS_DEV_DUMP_IR_PASSES="inline,validate,graph_build")
    command = [sys.executable, "-m", "bench.compile_features", "--child", config, "--batch", str(args.batch),
               "--image", str(args.image), "--steps", str(0 if nodes else args.steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=tree or None)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{config}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if nodes:
        result.update(count_nodes(folder))
        subprocess.run(["rm", "-rf", folder], check=False)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_features", description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configuration names")
    parser.add_argument("--reps", type=int, default=2, help="fresh processes per configuration (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after warm-up per process (default 3)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--nodes", action="store_true", help="also count graph nodes (one more process each)")
    parser.add_argument("--json", help="write every process's result to this file")
    parser.add_argument("--trees", default="", help="comma-separated checkout roots to compare (e.g. before,after): "
                        "every configuration of each, taking turns; default: this one")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.batch, args.image, args.steps)), flush=True)
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        print(f"--configs: unknown {', '.join(unknown)}; valid: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    print(f"load average at start: {os.getloadavg()}", flush=True)
    trees = [t.strip() for t in args.trees.split(",") if t.strip()] or [""]
    sides = [(tree, config) for config in configs for tree in trees]
    label = {side: (f"{Path(side[0]).name}: " if side[0] else "") + side[1] for side in sides}
    results = {label[side]: [] for side in sides}
    for rep in range(args.reps):
        for side in (sides if rep % 2 == 0 else sides[::-1]):
            config = label[side]
            result = _run_child(side[1], args, nodes=False, tree=side[0])
            results[config].append(result)
            print(f"rep {rep} {config}: compile {result['compile']:.2f} s ({result['compile_cpu']:.2f} s CPU), "
                  f"first call {result['first']:.2f} s, "
                  f"step {result['step'] * 1000:.0f} ms", flush=True)
    node_counts = {}
    if args.nodes:
        for side in sides:
            config = label[side]
            node_counts[config] = _run_child(side[1], args, nodes=True, tree=side[0])
            print(f"nodes {config}: {json.dumps({k: v for k, v in node_counts[config].items() if k != 'step'})}",
                  flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    print("| configuration | compile s (median) | compile CPU s | first call s | step ms "
          "| nodes (inline / validate / kernel graph) |")
    print("|---|---|---|---|---|---|")
    for config in results:
        runs = results[config] or [{"compile": float("nan"), "compile_cpu": float("nan"), "first": float("nan"),
                                    "step": float("nan")}]
        med = {key: statistics.median(r.get(key, float("nan")) for r in runs)
               for key in ("compile", "compile_cpu", "first", "step")}
        nodes = node_counts.get(config, {})
        spread = ", ".join(f"{r['compile']:.1f}" for r in runs)
        print(f"| {config} | {med['compile']:.2f} ({spread}) | {med['compile_cpu']:.2f} | "
              f"{med['first']:.2f} | {med['step'] * 1000:.0f} | {nodes.get('inline', '-')} / "
              f"{nodes.get('validate', '-')} / "
              f"{nodes.get('kernels', '-')} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "nodes": node_counts,
                                               "load_end": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
