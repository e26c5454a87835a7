"""``python -m trainkit [recipe=NAME] [group=option] [key=value ...]``: a thin Hydra main around ``train(cfg)``.

``--help`` lists the groups and recipes, ``--cfg job`` prints the composed config, ``-m`` sweeps.
With ``parallel.workers=N`` (or ``parallel.nodes``) the command starts msrun, which runs it again on N
worker processes (``trainkit/distributed/launch.py``); under msrun it trains as one rank of the job.

Exit statuses: 0 done; 1 a run that could not go on (its message, and for a crash the traceback, are in
``train.log``); 2 bad input; 128 + N stopped by signal N after a step, with a checkpoint there (143: SIGTERM,
130: SIGINT).
"""
import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from trainkit.process import protobuf_backend, signals, startup_gc

_STOPPED = ("stopped by {} outside the training loop (while starting up or finishing), so no checkpoint was written "
            "for it: run the command again (with trainer.resume=auto to continue a run)")
_STOPPED_DONE = ("stopped by {} outside the training loop, after the command had done its work (what it wrote is "
                 "complete)")


def _farewell(signum: int, done: bool) -> None:
    """The one line of a signal that ends the process outside the training loop (trainkit.process.signals.own_process
    calls it from its thread): the refusal goes into a new train.log only, as for bad input."""
    name = signal.Signals(signum).name
    if done:
        message = _STOPPED_DONE.format(name)
    else:
        message = _STOPPED.format(name)
        held_log = sys.modules.get("trainkit.rundir.held_log")  # not imported yet: nothing held, nothing to drop
        if held_log is not None:
            held_log.drop(RuntimeError(message))  # an earlier run's train.log keeps its bytes
    print(f"trainkit: {message}", file=sys.stderr, flush=True)


def _owns_process(entry: dict) -> bool:
    """Whether a signal may end this process from the signal thread: `entry` (the globals of the code that
    runs the command) is the top level of the module ``python -m`` started (``python -m trainkit``, a project's
    ``python -m`` through trainkit.project.main), not a test or a notebook running the command in-process; not under
    msrun (a worker's MindSpore clean-up tells the scheduler it is done). A ``-m`` sweep's launcher takes the signals
    back as exceptions while its jobs run, to write its summary (``signals.stop_by_exception``)."""
    name = getattr(entry.get("__spec__"), "name", None) or ""
    package = name[:-len(".__main__")] if name.endswith(".__main__") else name
    return (entry.get("__name__") == "__main__" and bool(package) and signals.command_package() == package
            and "MS_ROLE" not in os.environ)


def _entry() -> dict:
    """The globals of the module-level code that called main() (through trainkit.project.main for a project), or {}."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") == "trainkit.project.command":
        frame = frame.f_back
    return frame.f_globals if frame is not None and frame.f_code.co_name == "<module>" else {}


if __name__ == "__main__":  # before the imports below: a signal during one ends the process (process/signals.py)
    signals.start()
    startup_gc.pause()  # no full collection through the start-up (process/startup_gc.py); _hydra_main resumes it
    if _owns_process(globals()):
        signals.own_process(_farewell)  # and _stop, defined below, from main()

_WARNINGS_KEY = "logger.mindspore_warnings="


def _mindspore_log_level(argv) -> str:
    """MindSpore's ``GLOG_v``, which it reads once, when imported: errors only (3) unless
    ``logger.mindspore_warnings=true`` is on the command line (2: warnings too) or GLOG_v is set already."""
    asked = [a.split("=", 1)[1].strip().lower() for a in argv if a.lstrip("+").startswith(_WARNINGS_KEY)]
    if asked:
        return "2" if asked[-1] in ("true", "1", "yes", "on") else "3"
    return os.environ.get("GLOG_v", "3")  # noqa: SIM112 (MindSpore reads GLOG_v)


os.environ["GLOG_v"] = _mindspore_log_level(sys.argv[1:])  # noqa: SIM112 -- before anything imports mindspore
protobuf_backend.choose_upb()  # before MindSpore chooses protobuf's pure-Python backend (process/protobuf_backend.py)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from trainkit.app.config import best_metric, register_configs  # noqa: E402
from trainkit.app.sweep import register_resolver  # noqa: E402
from trainkit.errors import ConfigError, DataError, RunDirectoryInUse, RunInterrupted, TrainingError  # noqa: E402

register_configs()
register_resolver()
log = logging.getLogger("trainkit")


@hydra.main(version_base=None, config_path="pkg://trainkit.configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    """Train (or launch the workers that train); bad input ends the run with exit status 2, a run that cannot go
    on with 1, a signal with 128 + its number, each with one message.

    Returns the objective for Hydra's sweepers: the run's best ``trainer.best_metric`` (its ``best.json``). In a
    ``-m`` sweep a job that cannot go on is a failed row of the sweep's summary and the sweep goes on; bad input
    stops the sweep there (after writing the summary of the jobs so far).
    """
    from trainkit.app.sweep import objective, record_job
    from trainkit.distributed.launch import launch_workers, needs_launch, note_worker_pid
    from trainkit.distributed.parallel import close_log_files
    from trainkit.errors import disk_full
    from trainkit.rundir import held_log

    note_worker_pid()  # under a trainkit launcher: so a failure at once still names its rank
    start = time.perf_counter()
    held_log.hold()  # until train() accepts the input: a refusal leaves an earlier run's train.log as it was
    try:
        if needs_launch(cfg.parallel):
            from trainkit.app.config import check_config

            check_config(cfg)  # every value, before any process starts
            startup_gc.resume()  # the start-up is over: freeze it, collect again (trainkit/process/startup_gc.py)
            status = launch_workers(cfg)
            if status:
                return _failed(status, f"the workers of {_output_dir()} ended with exit status {status} (their logs "
                                       "are in msrun_logs/)", start, printed=True)
            record_job("completed", time.perf_counter() - start)
            return objective(_output_dir())  # the workers' metrics are in the run directory
        from trainkit.app import compile_cache, graph_reuse, train

        cached = compile_cache.enable(cfg)  # a second run of this config loads its graphs instead of compiling
        gc.freeze()  # MindSpore collects garbage before each graph compile: not through what exists by now
        startup_gc.resume()  # the start-up is over (its imports, the config): collect again (process/startup_gc.py)
        try:
            with graph_reuse.sharing(graph_reuse.key_of(cfg)):  # a sweep's next job may train these cells
                result = train(cfg)
        finally:
            gc.unfreeze()  # a process that runs more (a sweep, the tests' in-process runs) collects it again
            if cached is not None:
                compile_cache.disable()
    except RunDirectoryInUse as error:  # not a word into the run that is there
        held_log.discard()
        close_log_files()
        return _failed(2, str(error), start)
    except (ConfigError, DataError) as error:
        held_log.drop(error)  # into a new train.log only; the console gets the one stderr line below
        return _failed(2, str(error), start)
    except TrainingError as error:  # logged where it was raised
        held_log.release()
        return _failed(1, str(error), start)
    except RunInterrupted as stop:  # logged where it was raised; 128 + signal, as a shell reports a signal's end
        held_log.release()
        record_job("interrupted", time.perf_counter() - start, f"stopped by a signal (exit status {stop.status})",
                   exit_status=stop.status)
        sys.exit(stop.status)
    except Exception as error:  # a crash: the traceback goes to train.log as well as the console
        held_log.release()
        if disk_full(error):  # not a crash of trainkit's: one line (train.log may be on that disk too)
            message = _disk_full_message(error)
            log.error("%s", message)
            return _failed(1, message, start)
        log.exception("the run crashed: %s: %s", type(error).__name__, error)
        return _failed(1, f"the run crashed ({type(error).__name__}); the full traceback is in {_log_file()}", start)
    record_job("completed", time.perf_counter() - start, metrics=result.metrics)
    return objective(result.run_dir, result.metrics.get(best_metric(cfg), float("nan")))


def _failed(status: int, message: str, start: float, printed: bool = False) -> float:
    """End a run that failed: its one line on stderr, then exit with `status` -- except in a sweep, where a run that
    could not go on (1) is a failed job and the sweep goes on (the sweeper gets NaN)."""
    from trainkit.app.sweep import in_sweep, record_job, write_summary

    if not printed:
        print(f"trainkit: error: {message}", file=sys.stderr)
    record_job("failed", time.perf_counter() - start, message, exit_status=status)
    if in_sweep():
        if status == 1:
            return float("nan")
        from hydra.core.hydra_config import HydraConfig

        write_summary(Path(HydraConfig.get().sweep.dir))  # the jobs so far, this one a failed row
    sys.exit(status)


def _disk_full_message(error: OSError) -> str:
    """A full disk's one line: the file the write was for, and what is still whole (a checkpoint's own save says
    it itself: trainkit.rundir.checkpoint_file.nothing_partial_left)."""
    written = f"{error.filename} could not be written" if error.filename else "a file of the run could not be written"
    return (f"the disk is full ({error.strerror}): {written}; the checkpoints saved before are whole: free some "
            "space, then run the command again (with trainer.resume=auto to continue from the newest checkpoint)")


def _output_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir).resolve()


def _log_file() -> str:
    """Where this process's log lines are written: train.log, or msrun's worker log on ranks other than 0."""
    from trainkit.rundir.held_log import log_files

    for name in log_files():
        return name
    rank = os.environ.get("RANK_ID")
    return f"msrun's worker_{rank}.log" if rank is not None else "the output above"


def _unusable_run_dir(argv) -> Optional[str]:
    """Why the run directory cannot be written, or None: Hydra creates it and opens its train.log before trainkit
    runs, and a failure there would be a traceback. Checked for ``hydra.run.dir=PATH`` (or the default under
    ``outputs/``) when the command trains."""
    if any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--multirun", "-m") for a in argv):
        return None
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra.run.dir=")]
    if given and "${" in given[-1]:
        return None
    path = Path(given[-1]).expanduser() if given else Path("outputs")
    key = f"hydra.run.dir={given[-1]}" if given else "the run directory (default outputs/RECIPE/DATE_TIME)"
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{key}: {existing} is a file, not a folder: choose a directory with hydra.run.dir=PATH"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{key}: {existing} is not writable: choose a directory you can write with hydra.run.dir=PATH"
    log_file = path / "train.log"
    if log_file.exists() and not (log_file.is_file() and os.access(log_file, os.W_OK)):
        return f"{key}: {log_file} is not a writable file: choose another directory with hydra.run.dir=PATH"
    return None


class _Stopped(BaseException):
    """SIGTERM or SIGINT outside the training loop (whose SignalStop callback stops after a step with a checkpoint):
    a BaseException, so no ``except Exception`` on the way takes it for an error of its own."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame) -> None:
    raise _Stopped(signum)


def _shadowing_folder() -> Optional[str]:
    """The folder that hides the installed package, or None: run from the folder that holds a clone named
    ``trainkit``, ``python -m`` puts the current directory first and imports that folder (no ``__init__.py``) as
    ``trainkit`` -- its submodules still resolve, so the failure would come later and read as a missing name."""
    package = sys.modules.get("trainkit")
    if package is None or getattr(package, "__file__", None) is not None:
        return None
    here = Path(__file__).resolve().parent
    others = [str(path) for path in getattr(package, "__path__", []) if Path(path).resolve() != here]
    return others[0] if others else str(here)


def main() -> None:
    """The command line: msrun also runs the training command as its cluster's scheduler, which only serves.

    A command that owns its process ends it with ``signals.exit_process``: its ``atexit`` functions run, the
    interpreter's finalization (MindSpore's C++ clean-up, 0.6-1.2 s in which a signal would be lost) does not."""
    signals.start()  # idempotent: python -m trainkit did it before its imports, a project's command (cli) too
    if _owns_process(_entry()):
        signals.own_process(_farewell, _stop)
        try:
            _main()
        except SystemExit as end:
            signals.exit_process(_exit_status(end.code))
        signals.exit_process(0)
    try:
        _main()
    finally:  # every way out: an in-process command (tests, a notebook) leaves the signals as it found them
        late = signals.finish()
    if late is not None:  # came after _main put back the hold handlers: the work is done, the signal still counts
        print(f"trainkit: {_STOPPED_DONE.format(signal.Signals(late).name)}", file=sys.stderr)
        sys.exit(128 + late)


def _mistyped_override(argv) -> Optional[str]:
    """A value of trainkit's own groups its type refuses, in one line (before Hydra's six and status 1)."""
    from trainkit.app.config import check_override_types

    try:
        check_override_types(argv)
    except ConfigError as error:
        return str(error)
    return None


_exit_status = signals.exit_status  # the status sys.exit(code) gives


def _main() -> None:
    shadow = _shadowing_folder()
    if shadow:
        print(f"trainkit: error: the folder {shadow} hides the installed trainkit package (python -m puts the "
              "current directory first on the import path): run the command from another directory, e.g. inside "
              "that folder", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        from mindspore.communication import init

        signals.finish()  # the scheduler keeps the default actions: the launcher ends it with SIGTERM
        startup_gc.resume()
        init()  # returns when the workers are done
        return
    problem = _unusable_run_dir(sys.argv[1:]) or _mistyped_override(sys.argv[1:])
    if problem:
        print(f"trainkit: error: {problem}", file=sys.stderr)
        sys.exit(2)
    # _stop raises at the next bytecode: for in-process commands and a sweep's jobs; else the signal thread
    # ends the process when it finds _stop (or the hold handler) in place
    previous = {signum: signal.signal(signum, _stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        if signals.held() is not None:  # it came during the imports: stop as soon as the handler could
            raise _Stopped(signals.held())
        from trainkit.app.compose_once import once

        with once():  # Hydra composes the config once, not twice
            _hydra_main()
    except _Stopped as stop:
        from trainkit.rundir import held_log

        message = _STOPPED.format(stop)
        held_log.drop(RuntimeError(message))  # an earlier run's train.log keeps its bytes
        print(f"trainkit: {message}", file=sys.stderr)
        sys.exit(128 + stop.signum)
    finally:
        startup_gc.resume()  # where Hydra ended before _hydra_main (--help, a refused override): as it was
        for signum, handler in previous.items():
            signal.signal(signum, handler)

if __name__ == "__main__":
    main()
