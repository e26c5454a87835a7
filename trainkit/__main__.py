"""``python -m trainkit [recipe=NAME] [group=option] [key=value ...]``: a thin Hydra main around ``train(cfg)``.

``--help`` lists the groups and recipes, ``--cfg job`` prints the composed config, ``-m`` sweeps.
"""
import logging
import os
import sys

os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ logs: errors only, unless the user asks for more

import hydra
from omegaconf import DictConfig

from trainkit.config import register_configs
from trainkit.errors import ConfigError, DataError, TrainingError

register_configs()
log = logging.getLogger("trainkit")


@hydra.main(version_base=None, config_path="pkg://trainkit.configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Train; bad input ends the run with exit status 2, a run that cannot go on with 1, each with one message."""
    from trainkit.app import train

    try:
        result = train(cfg)
    except (ConfigError, DataError) as error:
        log.error("%s", error)
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(2)
    except TrainingError as error:  # logged where it was raised
        print(f"trainkit: error: {error}", file=sys.stderr)
        sys.exit(1)
    return result.metrics.get("accuracy", float("nan"))  # the objective for Hydra sweepers


if __name__ == "__main__":
    main()
