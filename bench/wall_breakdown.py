"""Where a `python -m trainkit` run's seconds go: `python -m bench.wall_breakdown [override ...]`.

Runs the command's own main in this process (the quick start unless overrides say otherwise) with timers
wrapped around the phases of a run, and prints one line per phase, the whole process's wall time (from the
kernel's start time of the process) and the time to the first training step. The timers wrap functions;
they add microseconds, not the milliseconds a profiler adds to every Python call. The process ends as the command's
does (``trainkit.process.signals.exit_process``: no interpreter finalization), so that a timer outside it (row 11) reads
the command's time. Nothing here is asserted: docs/performance.md quotes its output together with the load average
it prints.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional


def process_start() -> float:
    """The process's start as ``time.time()``, from /proc (10 ms resolution); now where /proc is absent."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            up = float(uptime.read().split()[0])
        return time.time() - (up - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class Timers:
    """Seconds per phase, summed over calls; nested phases are subtracted from the phase they run in."""

    def __init__(self):
        self.seconds: Dict[str, float] = collections.defaultdict(float)
        self.calls: Dict[str, int] = collections.defaultdict(int)
        self._stack: List[List[float]] = []  # [start, seconds of nested phases]
        self.first_step: Optional[float] = None
        self.gc_seconds = 0.0  # full collections (MindSpore runs one before each graph compile)

    @contextlib.contextmanager
    def phase(self, name: str):
        frame = [time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            spent = time.perf_counter() - frame[0]
            self.seconds[name] += spent - frame[1]
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][1] += spent

    def wrap(self, owner: object, attribute: str, name: str, when: Optional[Callable[..., Optional[str]]] = None):
        """Time every call of ``owner.attribute`` as phase `name` (or as what `when(*args)` names)."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase((when(*args) if when else None) or name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def _compile_kind(_executor, cell, *args, **kwargs) -> str:
    from trainkit.step.wrapper import TrainingWrapper

    return "compile: train graph" if isinstance(cell, TrainingWrapper) else "compile: eval graph"


def instrument(timers: Timers) -> None:
    """Wrap the phases of trainkit.app.training.train (its Run, trainkit.app.run_loop) and of what it calls."""
    from mindspore.graph import api
    from mindspore.train import Model

    import trainkit.app.run_loop as run_loop
    import trainkit.app.training as training
    from trainkit.callbacks import Evaluation
    from trainkit.callbacks.best_checkpoint import BestCheckpoint
    from trainkit.callbacks.train_metrics import TrainMetrics
    from trainkit.callbacks.training_checkpoint import PeriodicCheckpoint

    timers.wrap(training, "check_config", "checks: config")
    timers.wrap(run_loop.run, "set_context", "context, seeds")
    timers.wrap(run_loop.build, "instantiate_group", "data, model, loss, optimizer: building")
    timers.wrap(run_loop, "prepare_data", "data: preparation")
    timers.wrap(run_loop, "check_fit", "checks: the fit check (one forward pass)")
    for name in ("build_model", "build_loss_network_for", "build_optimizer", "build_wrapper", "build_learning_rates",
                 "build_model_runner", "build_callbacks"):
        timers.wrap(run_loop.build, name, "data, model, loss, optimizer: building")
    timers.wrap(run_loop.run, "save_config", "run directory: config, logs")
    timers.wrap(api._CellGraphExecutor, "compile", "compile", when=_compile_kind)
    timers.wrap(Model, "train", "training steps (steady state: the loop, the steps, per-step callbacks)")
    timers.wrap(Evaluation, "evaluate", "evaluation (without its compile)")
    timers.wrap(run_loop, "evaluate_test_set", "the test set: best.ckpt's weights evaluated (without compiles)")
    timers.wrap(PeriodicCheckpoint, "on_train_epoch_end", "checkpoints")
    timers.wrap(BestCheckpoint, "on_train_epoch_end", "checkpoints")
    original = TrainMetrics.on_train_step_end

    def first_step(self, run_context):
        if timers.first_step is None:
            timers.first_step = time.time()
        return original(self, run_context)

    TrainMetrics.on_train_step_end = first_step


class Breakdown(NamedTuple):
    seconds: Dict[str, float]  # per phase, each without the phases nested in it
    wall: float                # the whole process, from its start
    first_step: Optional[float]  # from the process's start to the end of the first training step
    gc_seconds: float          # full garbage collections, inside the phases above
    cpu_seconds: float         # user + system time of the process (less disturbed by other load than wall time)
    status: int                # the command's exit status


def run(argv: List[str]) -> Breakdown:
    """Run ``python -m trainkit argv`` in this process, timing its phases."""
    start = process_start()
    os.environ.setdefault("GLOG_v", "3")  # noqa: SIM112 -- as the command sets it before importing MindSpore
    timers = Timers()
    from trainkit.process import protobuf_backend, startup_gc

    protobuf_backend.choose_upb()  # as python -m trainkit does before anything imports MindSpore
    startup_gc.pause()  # as python -m trainkit does before its imports; its _hydra_main resumes the collector
    with timers.phase("import: mindspore"):
        import mindspore  # noqa: F401
    with timers.phase("import: trainkit, Hydra, the config store"):
        sys.argv = ["trainkit", *argv]
        import trainkit.__main__ as command
        import trainkit.app.training  # noqa: F401  (what `train` imports on first use)
    instrument(timers)
    collecting: List[float] = []

    def on_gc(phase: str, info: dict) -> None:  # the garbage collector's own time, across the phases above
        if info.get("generation") == 2:
            if phase == "start":
                collecting.append(time.perf_counter())
            elif collecting:
                timers.gc_seconds += time.perf_counter() - collecting.pop()

    import gc

    gc.callbacks.append(on_gc)
    from hydra._internal.hydra import Hydra

    timers.wrap(Hydra, "compose_config", "Hydra: compose the config")
    status = 0
    with timers.phase("Hydra's main, logging, the rest"):
        try:
            command.main()
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
    end = time.time()
    seconds = dict(timers.seconds)
    seconds["Python start-up (before the first import)"] = (end - start) - sum(seconds.values())
    first = timers.first_step - start if timers.first_step is not None else None
    cpu = os.times()
    return Breakdown(seconds, end - start, first, timers.gc_seconds, cpu.user + cpu.system, status)


def main(argv: List[str]) -> int:
    result = run(argv)
    load = os.getloadavg()
    first = "-" if result.first_step is None else f"{result.first_step:.2f}"
    print(f"python -m trainkit {' '.join(argv)}: whole process {result.wall:.2f} s ({result.cpu_seconds:.2f} s CPU), "
          f"first step at {first} s, exit status {result.status}, load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}", file=sys.stderr)
    for name, value in sorted(result.seconds.items(), key=lambda item: -item[1]):
        print(f"{value:7.2f} s  {100 * value / result.wall:5.1f} %  {name}", file=sys.stderr)
    print(f"{result.gc_seconds:7.2f} s  {100 * result.gc_seconds / result.wall:5.1f} %  (inside the above: full "
          "garbage collections)", file=sys.stderr)
    return result.status


if __name__ == "__main__":
    exit_status = main(sys.argv[1:])
    from trainkit.process import signals

    # As python -m trainkit ends its process: the atexit functions, then no interpreter finalization (MindSpore's
    # C++ clean-up, 0.3-0.7 s after a ResNet-50 run), so that row 11's whole-process time is the command's.
    signals.exit_process(exit_status)
