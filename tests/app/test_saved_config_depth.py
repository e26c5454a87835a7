"""A stored config (a run directory's ``.hydra/config.yaml``, read by every tool through
:func:`trainkit.app.tool_config.saved_config`) holds data only: an escaped interpolation (``\\${...}``, which turns
live when the config is resolved) or a resolver call is refused at any depth, inside lists as inside mappings.

Seeded generated configs: a value planted at the end of a random path of mappings and lists; the same file with a
plain value there loads and gives that value back (the file is otherwise valid: the refusal is the planted value's).
"""
import random

import pytest
import yaml

from trainkit.app.tool_config import saved_config
from trainkit.errors import ConfigError

PLANTED = [r"\${oc.env:HOME}", r"\${oc.create:{_target_: pathlib.Path, _args_: [/tmp/x]}}", "${oc.env:HOME}",
           r"a \${model.hidden_sizes} b", "${oc.create:{_target_: trainkit.parts.losses.CrossEntropy}}"]


def planted_config(rng: random.Random, leaf):
    """A config whose ``data`` holds `leaf` at the end of a random path of 1-5 mappings and lists (at least one
    list), among plain siblings; the path as (key or index, ...)."""
    steps = [rng.choice(["dict", "list"]) for _ in range(rng.randint(1, 5))]
    if "list" not in steps:
        steps[rng.randrange(len(steps))] = "list"
    node, path = leaf, []
    for kind in reversed(steps):
        siblings = [rng.choice([rng.randint(-5, 5), round(rng.random(), 3), "text", None, True]) for _ in
                    range(rng.randint(0, 3))]
        if kind == "list":
            index = rng.randint(0, len(siblings))
            node = siblings[:index] + [node] + siblings[index:]
            path.append(index)
        else:
            key = f"k{rng.randint(0, 9)}"
            node = {**{f"s{i}": value for i, value in enumerate(siblings)}, key: node}
            path.append(key)
    config = {"model": {"_target_": "trainkit.models.mlp.MLP", "in_features": 4, "out_features": 2,
                        "hidden_sizes": [8]}, "data": {"batch_size": 4, "extra": node}}
    return config, ["data", "extra", *reversed(path)]


def run_dir_with(tmp_path, name, config):
    run_dir = tmp_path / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return run_dir


def test_an_interpolation_planted_inside_lists_at_any_depth_is_refused(tmp_path):
    """Mutation caught: the data-only walk (trainkit/rundir/trust.py check_data_only) not entering lists (red: the
    escaped value turns live, or the resolver runs)."""
    rng = random.Random(0)
    for case in range(80):
        planted = rng.choice(PLANTED)
        state = rng.getstate()
        config, path = planted_config(rng, planted)
        rng.setstate(state)
        plain, _ = planted_config(rng, "plain value")  # the same structure, the same draws
        loaded = saved_config(run_dir_with(tmp_path, f"plain{case}", plain), [])
        node = loaded
        for step in path:
            node = node[step]
        assert node == "plain value", (case, path)
        with pytest.raises(ConfigError) as refused:
            saved_config(run_dir_with(tmp_path, f"planted{case}", config), [])
        assert "\n" not in str(refused.value), (case, str(refused.value))
