"""``python -m trainkit [recipe=NAME] [group=option] [key=value ...]``: a thin Hydra main around ``train(cfg)``.

``--help`` lists the groups and recipes, ``--cfg job`` prints the composed config, ``-m`` sweeps.
With ``parallel.workers=N`` (or ``parallel.nodes``) the command starts msrun, which runs it again on N
worker processes (``trainkit/distributed/launch.py``); under msrun it trains as one rank of the job.

Exit statuses: 0 done; 1 a run that could not go on (its message, and for a crash the traceback, are in
``train.log``); 2 bad input; 128 + N stopped by signal N after a step, with a checkpoint there (143: SIGTERM,
130: SIGINT).
"""
import logging
import os
import sys
import time
from pathlib import Path

_WARNINGS_KEY = "logger.mindspore_warnings="


def _mindspore_log_level(argv) -> str:
    """MindSpore's ``GLOG_v``, which it reads once, when imported: errors only (3) unless
    ``logger.mindspore_warnings=true`` is on the command line (2: warnings too) or GLOG_v is set already."""
    asked = [a.split("=", 1)[1].strip().lower() for a in argv if a.lstrip("+").startswith(_WARNINGS_KEY)]
    if asked:
        return "2" if asked[-1] in ("true", "1", "yes", "on") else "3"
    return os.environ.get("GLOG_v", "3")  # noqa: SIM112 (MindSpore reads GLOG_v)


os.environ["GLOG_v"] = _mindspore_log_level(sys.argv[1:])  # noqa: SIM112 -- before anything imports mindspore

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
    from trainkit.distributed.launch import launch_workers, needs_launch
    from trainkit.distributed.parallel import close_log_files

    start = time.perf_counter()
    try:
        if needs_launch(cfg.parallel):
            from trainkit.app.config import check_config

            check_config(cfg)  # every value, before any process starts
            status = launch_workers(cfg)
            if status:
                return _failed(status, f"the workers of {_output_dir()} ended with exit status {status} (their logs "
                                       "are in msrun_logs/)", start, printed=True)
            record_job("completed", time.perf_counter() - start)
            return objective(_output_dir())  # the workers' metrics are in the run directory
        from trainkit.app import train

        result = train(cfg)
    except RunDirectoryInUse as error:  # not a word into the run that is there
        close_log_files()
        return _failed(2, str(error), start)
    except (ConfigError, DataError) as error:
        _record_in_log_file(error)  # the console gets the one stderr line below, not the same words twice
        return _failed(2, str(error), start)
    except TrainingError as error:  # logged where it was raised
        return _failed(1, str(error), start)
    except RunInterrupted as stop:  # logged where it was raised; 128 + signal, as a shell reports a signal's end
        record_job("interrupted", time.perf_counter() - start, f"stopped by a signal (exit status {stop.status})",
                   exit_status=stop.status)
        sys.exit(stop.status)
    except Exception as error:  # a crash: the traceback goes to train.log as well as the console
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


def _output_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir).resolve()


def _record_in_log_file(error: Exception) -> None:
    """Write the error into train.log only: on the console it is the one ``trainkit: error:`` line."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (error,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _log_file() -> str:
    """Where this process's log lines are written: train.log, or msrun's worker log on ranks other than 0."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    rank = os.environ.get("RANK_ID")
    return f"msrun's worker_{rank}.log" if rank is not None else "the output above"


def main() -> None:
    """The command line: msrun also runs the training command as its cluster's scheduler, which only serves."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        from mindspore.communication import init

        init()  # returns when the workers are done
        return
    _hydra_main()


if __name__ == "__main__":
    main()
