"""Where a port zoo row's seconds go: ``python -m bench.port_phases MODEL...`` (the zoo's labels, e.g.
``"torchvision alexnet"``) ports each model as ``bench.port_zoo`` does, in a process of its own, with timers
wrapped around port's phases, and prints every phase's own seconds (a phase nested in another is not counted
twice: "torch build" inside a rebuild counts as "torch build", not as "rebuilds").

The imports (MindSpore, torch, torchvision, timm: about 6 s) are made before the clock starts: a zoo run pays
them once, not once per row. Phases under "rebuilds (port_arguments)" are the constructor-argument and depth
ports (a model built again with one argument changed, and ported again: ``port_arguments``, ``port_depth``).
"""
from __future__ import annotations

import argparse
import builtins
import contextlib
import functools
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

Seconds = Dict[str, float]


class Timers:
    """Each phase's own seconds: a phase's time less that of the phases it calls."""

    def __init__(self):
        self.own: Seconds = {}
        self.stack: List[List] = []  # [label, start, time of the phases it called]

    @contextlib.contextmanager
    def phase(self, label: str):
        if any(name.startswith("rebuilds") for name, _, _ in self.stack) and not label.startswith("rebuilds"):
            label = f"rebuilds: {label}"
        self.stack.append([label, time.perf_counter(), 0.0])
        try:
            yield
        finally:
            name, start, inner = self.stack.pop()
            elapsed = time.perf_counter() - start
            self.own[name] = self.own.get(name, 0.0) + elapsed - inner
            if self.stack:
                self.stack[-1][2] += elapsed

    def wrap(self, owner, attribute: str, label: str, when: Optional[Callable[..., bool]] = None) -> None:
        """Time ``owner.attribute`` (a function or method) as `label` (where ``when(*args)``, if given)."""
        original = getattr(owner, attribute)
        timers = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if when is not None and not when(*args, **kwargs):
                return original(*args, **kwargs)
            with timers.phase(label):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def instrument(timers: Timers) -> None:
    """Wrap port's phases (the import of each module is done here, before any clock)."""
    import torch.fx

    import bench.port_zoo as zoo
    from trainkit.bridge import compare, port
    from trainkit.bridge.port import source as port_source

    timers.wrap(zoo, "parameter_count", "torch build (meta, parameter count)")
    timers.wrap(zoo, "weights_without_zeros", "zoo weights (build, randomise, torch.save)")
    if hasattr(zoo, "own_weights"):  # port_zoo builds the model once, and port takes it (no file)
        timers.wrap(zoo, "own_weights", "zoo weights (build, randomise, torch.save)")
    timers.wrap(port, "import_model", "torch build")
    timers.wrap(port, "load_torch_weights", "torch load weights")
    timers.wrap(port, "generate", "code generation (rest)")
    timers.wrap(port_source, "_take_arguments", "rebuilds (port_arguments, port_depth: rest)")
    timers.wrap(port_source, "record", "value tracing (record)")
    timers.wrap(torch.fx.Tracer, "trace", "fx tracing (with values)")
    timers.wrap(port_source, "_check_compiles", "code generation (rest)")
    timers.wrap(port, "load_generated", "import the generated package")
    timers.wrap(port, "convert_state_dict", "weights conversion")
    timers.wrap(port, "load_weights", "MindSpore load weights")
    timers.wrap(port, "write_checkpoint", "write weights.ckpt")
    timers.wrap(compare, "network_outputs", "compare: MindSpore forward (PyNative, hooks)")
    timers.wrap(compare, "torch_outputs", "compare: PyTorch forward (hooks)")
    timers.wrap(compare, "layer_table", "compare: the table")
    timers.wrap(compare, "torch_names", "compare: name pairing")
    port.compare_layers = compare.compare_layers
    timers.wrap(port, "compare_layers", "compare: rest")

    def built(value, name, *default):  # `getattr(module, ported.top)()` in port: the MindSpore network's build
        found = builtins.getattr(value, name, *default)
        if getattr_is_generated(value):
            return lambda: _timed_call(timers, found)
        return found

    port.getattr = built


def getattr_is_generated(value) -> bool:
    return type(value).__name__ == "module" and value.__name__.endswith(".model") and "zoo" in value.__name__


def _timed_call(timers: Timers, factory):
    with timers.phase("MindSpore network build (parameter init)"):
        return factory()


def measure(label: str, threads: int = 0) -> Dict[str, object]:
    """Port the zoo model `label` with timers; {"row": its zoo row, "total": s, "phases": {phase: own s}}."""
    import bench.port_zoo as zoo

    torchvision, _ = zoo.import_zoo()
    import torch

    import trainkit.bridge.port  # noqa: F401 - MindSpore's import, outside the clock

    if hasattr(zoo, "worker_setup"):  # a port_zoo worker's settings (torch threads, synchronous MindSpore)
        zoo.worker_setup(threads or 1)
    elif threads:
        torch.set_num_threads(threads)
    timers = Timers()
    instrument(timers)
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="port_phases_"))
    sys.path.insert(0, str(work))
    for index, (name, target, arguments, shape, factory) in enumerate(zoo.cases(torchvision)):
        if name != label:
            continue
        with timers.phase("other (port's checks, torch check forward, files)"):
            start = time.perf_counter()
            zoo.parameter_count(factory, arguments)
            with contextlib.redirect_stdout(io.StringIO()):
                result = zoo.port_one(name, target, arguments, shape, work / f"zoo{index}", factory)
            total = time.perf_counter() - start
        return {"row": result.row(), "total": total, "phases": timers.own, "folder": str(work / f"zoo{index}")}
    raise SystemExit(f"no zoo model is labelled {label!r}: give a label of docs/coming-from-pytorch.md's table")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.port_phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help='zoo labels, e.g. "torchvision resnet18"')
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (default: port_zoo's "
                        "worker's, else torch's own)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.models[0], args.torch_threads)))
        return 0
    for label in args.models:
        done = subprocess.run([sys.executable, "-m", "bench.port_phases", "--child", label,
                               "--torch-threads", str(args.torch_threads)], capture_output=True,
                              text=True, check=False)
        if done.returncode:
            print(f"{label}: failed\n{done.stderr[-2000:]}")
            continue
        found = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{found['row']}  total {found['total']:.1f} s")
        for phase, seconds in sorted(found["phases"].items(), key=lambda item: -item[1]):
            print(f"    {seconds:7.2f}  {phase}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
