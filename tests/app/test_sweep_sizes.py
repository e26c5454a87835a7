"""A sweep's size is checked before its folder or its list of jobs exists: ``sweep.repeats`` in [1, 1000], and
repeats x the configurations the sweeper will ask for at most 10,000 jobs (issue 47). The bounds are written here
as the documentation states them; the number of configurations is counted here from the overrides themselves."""
import random

import pytest
from omegaconf import OmegaConf

from trainkit.app.sweep.launcher import size_problem

BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def sweep_config(repeats, task, sweeper=BASIC, params=None, n_trials=None):
    node = {"_target_": sweeper, "params": params}
    if n_trials is not None:
        node["n_trials"] = n_trials
    return OmegaConf.create({"sweep": {"repeats": repeats}, "hydra": {"sweeper": node, "overrides": {"task": task}}})


def test_sizes_are_refused_exactly_when_repeats_or_jobs_pass_their_bounds():
    """Seeded random sweeps: choice lists and ranges on the command line and in hydra.sweeper.params. Mutations:
    the jobs' bound not checked (red: the 10,000 cases pass), repeats > 1000 accepted (red), hydra.sweeper.params
    left out of the count (red)."""
    generator = random.Random(0)
    refused = accepted = 0
    for _ in range(300):
        repeats = generator.choice([0, -3, 1, 2, 3, 10, 999, 1000, 1001, 10 ** 9, generator.randint(1, 50)])
        task, params, configurations = [f"sweep.repeats={repeats}", "trainer.epochs=1"], {}, 1
        for index in range(generator.randint(0, 3)):
            size = generator.choice([1, 2, 3, 7, 40, 150, 1000])
            if generator.random() < 0.5:
                value = ",".join(str(v / 1000) for v in range(1, size + 1)) if size > 1 else "0.5"
            else:
                start = generator.randint(-5, 5)
                value = f"range({start},{start + size})"
            configurations *= size
            if generator.random() < 0.3:
                params[f"model.key{index}"] = value
            else:
                task.append(f"+model.key{index}={value}")
        problem = size_problem(sweep_config(repeats, task, params=params))
        if not 1 <= repeats <= 1000:
            assert problem == (f"sweep.repeats={repeats} is not valid: it must be an integer in [1, 1,000] (the "
                               "seeds each configuration of a -m sweep runs with)")
        elif repeats * configurations > 10_000:
            assert problem is not None and problem.startswith(f"sweep.repeats={repeats} gives ")
            assert "a -m sweep runs at most 10,000" in problem
            if configurations <= 10_000:
                assert f"= {repeats * configurations:,} jobs" in problem
        else:
            assert problem is None, (repeats, task, params)
        refused += problem is not None
        accepted += problem is None
    assert refused > 50 and accepted > 50  # both sides were tried


def test_optuna_s_trials_count_as_its_configurations():
    assert size_problem(sweep_config(3, [], sweeper=OPTUNA, n_trials=3334)) is not None  # 10,002 jobs
    assert size_problem(sweep_config(3, [], sweeper=OPTUNA, n_trials=3333)) is None  # 9,999
    assert size_problem(sweep_config(2, ["+model.x=interval(0,1)"], sweeper="some.OtherSweeper")) is None


@pytest.mark.parametrize("repeats", [0, 1001])
def test_check_config_states_the_same_bound(repeats):
    from trainkit.app.config import _check_repeats
    from trainkit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"sweep.repeats=\d+ is not valid: it must be an integer in \[1, 1,000\]"):
        _check_repeats(OmegaConf.create({"sweep": {"repeats": repeats}}))
