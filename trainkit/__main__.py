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
import sys

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
from trainkit.errors import ConfigError, DataError, RunDirectoryInUse, RunInterrupted, TrainingError  # noqa: E402

register_configs()
log = logging.getLogger("trainkit")


@hydra.main(version_base=None, config_path="pkg://trainkit.configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    """Train (or launch the workers that train); bad input ends the run with exit status 2, a run that cannot go
    on with 1, a signal with 128 + its number, each with one message."""
    from trainkit.distributed.launch import launch_workers, needs_launch
    from trainkit.distributed.parallel import close_log_files

    try:
        if needs_launch(cfg.parallel):
            from trainkit.app.config import check_config

            check_config(cfg)  # every value, before any process starts
            status = launch_workers(cfg)
            if status:
                sys.exit(status)
            return float("nan")  # the workers' metrics are in the run directory
        from trainkit.app import compile_cache, train

        cached = compile_cache.enable(cfg)  # a second run of this config loads its graphs instead of compiling
        gc.freeze()  # MindSpore collects garbage before each graph compile: not through what exists by now
        try:
            result = train(cfg)
        finally:
            gc.unfreeze()  # a process that runs more (a sweep, the tests' in-process runs) collects it again
            if cached is not None:
                compile_cache.disable()
    except RunDirectoryInUse as error:  # not a word into the run that is there
        close_log_files()
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(2)
    except (ConfigError, DataError) as error:
        _record_in_log_file(error)  # the console gets the one stderr line below, not the same words twice
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(2)
    except TrainingError as error:  # logged where it was raised
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(1)
    except RunInterrupted as stop:  # logged where it was raised; 128 + signal, as a shell reports a signal's end
        sys.exit(stop.status)
    except Exception as error:  # a crash: the traceback goes to train.log as well as the console
        log.exception("the run crashed: %s: %s", type(error).__name__, error)
        print(f"trainkit: error: the run crashed ({type(error).__name__}); the full traceback is in "
              f"{_log_file()}", file=sys.stderr)
        sys.exit(1)
    return result.metrics.get(best_metric(cfg), float("nan"))  # the objective for Hydra sweepers


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
