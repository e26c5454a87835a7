"""``python -m trainkit [recipe=NAME] [group=option] [key=value ...]``: a thin Hydra main around ``train(cfg)``.

``--help`` lists the groups and recipes, ``--cfg job`` prints the composed config, ``-m`` sweeps.
With ``parallel.workers=N`` (or ``parallel.nodes``) the command starts msrun, which runs it again on N
worker processes (``trainkit/launch.py``); under msrun it trains as one rank of the job.
"""
import logging
import os
import sys

os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ logs: errors only, unless the user asks for more

import hydra
from omegaconf import DictConfig

from trainkit.config import best_metric, register_configs
from trainkit.errors import ConfigError, DataError, TrainingError

register_configs()
log = logging.getLogger("trainkit")


@hydra.main(version_base=None, config_path="pkg://trainkit.configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    """Train (or launch the workers that train); bad input ends the run with exit status 2, a run that cannot go
    on with 1, each with one message."""
    from trainkit.launch import launch_workers, needs_launch

    try:
        if needs_launch(cfg.parallel):
            status = launch_workers(cfg)
            if status:
                sys.exit(status)
            return float("nan")  # the workers' metrics are in the run directory
        from trainkit.app import train

        result = train(cfg)
    except (ConfigError, DataError) as error:
        log.error("%s", error)
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(2)
    except TrainingError as error:  # logged where it was raised
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(1)
    return result.metrics.get(best_metric(cfg), float("nan"))  # the objective for Hydra sweepers


def main() -> None:
    """The command line: msrun also runs the training command as its cluster's scheduler, which only serves."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        from mindspore.communication import init

        init()  # returns when the workers are done
        return
    _hydra_main()


if __name__ == "__main__":
    main()
