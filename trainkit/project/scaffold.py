"""``python -m trainkit.new NAME [FOLDER]``: write a project that trains out of the box with its own command.

The project (FOLDER, default ``./NAME``) holds a package ``NAME`` -- a model, a data module (Gaussian blobs made
with NumPy: no download), a callback that logs, ``__main__.py`` calling ``trainkit.project.main`` and its ``conf/``
(its primary config, a recipe, the model and data groups) -- plus a test, a README and a ``pyproject.toml``. Then
``cd FOLDER && python -m NAME`` trains, ``python -m NAME --help`` lists its recipe beside trainkit's, and
``python -m pytest`` runs its test. Nothing is written when FOLDER exists and is not empty.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from trainkit.checks import package_name_problem
from trainkit.checks.generated_code import IMPORTS, check_generated
from trainkit.errors import ConfigError

_FILES: Dict[str, str] = {
    "pyproject.toml": '''\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "A trainkit project"
requires-python = ">=3.9"
dependencies = ["trainkit"]

[tool.setuptools.packages.find]
include = ["{name}*"]

[tool.setuptools.package-data]
"{name}" = ["conf/*.yaml", "conf/*/*.yaml"]
"*" = ["weights.ckpt", "buffers.npz"]  # a package python -m trainkit.port --into wrote
''',
    "README.md": '''\
# {name}

A training project on [trainkit](https://pypi.org/project/trainkit/): its own model (`{name}/model.py`), data
module (`{name}/data.py`), callback (`{name}/callbacks.py`) and configs (`{name}/conf/`), with a command of its
own (`{name}/__main__.py`).

```
python -m {name}                              # train the project's recipe; a run directory under outputs/
python -m {name} trainer.epochs=20 model.hidden=64 optimizer.lr=0.003
python -m {name} -m optimizer.lr=0.001,0.003,0.01   # a sweep; summary.md names the winner
python -m {name} --help                       # the groups and recipes: the project's beside trainkit's
python -m pytest tests                        # the project's test
pip install -e .                              # then python -m {name} works from any directory
```

Replace the blobs with your data in `{name}/data.py` (keep `prepare`, `train_dataset`, `eval_dataset`,
`test_dataset` and `num_classes`), and the MLP with your network in `{name}/model.py`; their arguments are the
keys of `{name}/conf/data/{name}_blobs.yaml` and `{name}/conf/model/{name}_mlp.yaml` (a config named like one of
trainkit's, `model/mlp.yaml`, is refused: Hydra would read trainkit's instead).
''',
    "{name}/__init__.py": '''\
"""{name}: a trainkit project."""
''',
    "{name}/__main__.py": '''\
"""``python -m {name} [recipe=NAME] [key=value ...]``: trainkit's command with this project's configs."""
from trainkit.project import main

if __name__ == "__main__":
    main(config_path="conf", config_name="{name}")
''',
    "{name}/model.py": '''\
"""The project's network: any ``mindspore.nn.Cell`` from a batch of inputs to logits."""
from mindspore import nn


class MLP(nn.Cell):
    """Two dense layers; `num_features` and `num_classes` come from the data module when left null."""

    def __init__(self, num_features: int, num_classes: int, hidden: int = 32):
        super().__init__()
        self.layers = nn.SequentialCell(nn.Dense(num_features, hidden), nn.ReLU(), nn.Dense(hidden, num_classes))

    def construct(self, features):
        return self.layers(features)
''',
    "{name}/data.py": '''\
"""The project's data module: Gaussian blobs made with NumPy (replace them with yours).

What trainkit asks of a data module: ``prepare()`` (check the data; raise ``trainkit.errors.DataError`` naming
the file and the fix), the attributes that fill the model's null keys (``num_features``, ``num_classes``), and
``train_dataset``/``eval_dataset`` (validation: best checkpoint, early stopping)/``test_dataset`` (held out,
evaluated once at the end) returning batched ``mindspore.dataset`` datasets of (input, label).
"""
import mindspore.dataset as ds
import numpy as np

from trainkit.data import check_values


class Blobs:
    """`samples` points in `num_features` dimensions around `num_classes` centres; 70 / 15 / 15 split."""

    values_checked = True  # prepare() checks every value, so trainkit need not check the first epoch's batches

    def __init__(self, samples: int = 1200, num_features: int = 8, num_classes: int = 3, spread: float = 2.5,
                 batch_size: int = 32, seed: int = 0):
        self.samples, self.num_features, self.num_classes = samples, num_features, num_classes
        self.spread, self.batch_size, self.seed = spread, batch_size, seed
        self._splits = None

    def prepare(self) -> None:
        rng = np.random.default_rng(self.seed)
        centres = rng.normal(0.0, 3.0, size=(self.num_classes, self.num_features))
        labels = rng.integers(0, self.num_classes, size=self.samples)
        features = centres[labels] + rng.normal(0.0, self.spread, size=(self.samples, self.num_features))
        check_values("blobs", {{"features": features}}, {{"labels": labels}}, num_classes=self.num_classes)
        features, labels = features.astype(np.float32), labels.astype(np.int32)
        train, val = int(0.7 * self.samples), int(0.85 * self.samples)
        self._splits = {{"train": (features[:train], labels[:train]), "val": (features[train:val], labels[train:val]),
                        "test": (features[val:], labels[val:])}}

    def _dataset(self, split: str, num_shards: int, shard_id: int) -> ds.Dataset:
        if self._splits is None:
            self.prepare()
        features, labels = self._splits[split]
        training = split == "train"
        data = ds.NumpySlicesDataset({{"features": features, "label": labels}}, shuffle=training,
                                     num_shards=num_shards, shard_id=shard_id)
        return data.batch(self.batch_size, drop_remainder=training)

    def train_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset("train", num_shards, shard_id)

    def eval_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset("val", num_shards, shard_id)

    def test_dataset(self, num_shards: int = 1, shard_id: int = 0) -> ds.Dataset:
        return self._dataset("test", num_shards, shard_id)
''',
    "{name}/callbacks.py": '''\
"""A callback that records a value of its own in metrics.jsonl and TensorBoard, beside trainkit's."""
import math

from trainkit import Callback


class WeightNorm(Callback):
    """The L2 norm of the trainable weights after each epoch."""

    def on_epoch_end(self, state):
        squares = sum(float((p.asnumpy().astype("float64") ** 2).sum()) for p in state.network.trainable_params())
        self.log("custom/weight_norm", math.sqrt(squares))
''',
    "{name}/conf/{name}.yaml": '''\
# The project's primary config: trainkit's, with this project's recipe as the default.
defaults:
  - config
  - override recipe: {name}
  - _self_
''',
    "{name}/conf/recipe/{name}.yaml": '''\
# @package _global_
# python -m {name}   (or python -m {name} recipe={name}); every key can be overridden on the command line.
defaults:
  - override /model: {name}_mlp    # conf/model/{name}_mlp.yaml (named apart from trainkit's own model=mlp)
  - override /data: {name}_blobs
  - override /optimizer: adam
  - override /lr_schedule: cosine

optimizer:
  lr: 0.01
lr_schedule:
  warmup_epochs: 1
trainer:
  epochs: 5
callbacks:
  - _target_: {name}.callbacks.WeightNorm
''',
    "{name}/conf/model/{name}_mlp.yaml": '''\
# The keys are {name}.model.MLP's arguments; null ones come from the data module.
_target_: {name}.model.MLP
num_features: null
num_classes: null
hidden: 32
''',
    "{name}/conf/data/{name}_blobs.yaml": '''\
# The keys are {name}.data.Blobs's arguments.
_target_: {name}.data.Blobs
samples: 1200
num_features: 8
num_classes: 3
spread: 2.5
batch_size: 32
seed: 0
''',
    "tests/test_train.py": '''\
"""The project trains through its own command and beats chance on its held-out test set."""
import json
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]


def test_the_project_trains_and_records(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "{name}", "trainer.epochs=2", "logger.progress=off",
                           f"hydra.run.dir={{run_dir}}"], cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (test,) = [r for r in records if "test/accuracy" in r]
    assert test["test/accuracy"] > 1 / 3  # above chance for three classes
    assert [r["epoch"] for r in records if "custom/weight_norm" in r] == [1, 2]
''',
}


#: What the project's files import: trainkit, MindSpore, NumPy, and the standard modules its test runs with.
_IMPORTS = IMPORTS | {"json", "subprocess", "sys"}


def write_project(name: str, folder: Path) -> List[Path]:
    """Write the project `name` into `folder` (which must not exist, or be empty); the files written.

    Raises:
        ConfigError: `name` cannot be the package's (:func:`_name_problem`), or a generated module fails
            :func:`trainkit.checks.generated_code.check_generated`; nothing is written then.
    """
    problem = _name_problem(name, folder)
    if problem:
        raise ConfigError(f"{name!r} cannot be the project's package name: it {problem}; choose another "
                          f"(e.g. {_suggest(name, folder)})")
    files = {template.format(name=name): text.format(name=name) for template, text in _FILES.items()}
    check_generated({path: text for path, text in files.items() if path.endswith(".py")}, _IMPORTS,
                    by="trainkit.new")
    written = []
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainkit.new", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the project's package name (a Python identifier, e.g. myproject)")
    parser.add_argument("folder", nargs="?", help="where to write it (default: ./NAME); must not exist or be empty")
    args = parser.parse_args(argv)
    name = args.name
    folder = Path(args.folder or name).expanduser().absolute()
    problem = _name_problem(name, folder)
    if problem:
        print(f"trainkit: error: {name!r} cannot be the project's package name: it {problem}; choose another "
              f"(e.g. {_suggest(name, folder)})", file=sys.stderr)
        return 2
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        what = "a file" if not folder.is_dir() else "a folder that is not empty"
        print(f"trainkit: error: {folder} is {what}: nothing was written; choose a new folder "
              f"(python -m trainkit.new {name} FOLDER)", file=sys.stderr)
        return 2
    try:
        written = write_project(name, folder)
    except ConfigError as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"trainkit: error: cannot write the project into {folder}: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files into {folder}:")
    for path in written:
        print(f"  {path.relative_to(folder)}")
    print(f"next: cd {folder} && python -m {name}        (python -m {name} --help lists what you can set)")
    return 0


_RESERVED = ("trainkit", "mindspore", "tests", "test")


def _name_problem(name: str, folder: Path) -> Optional[str]:
    """Why `name` cannot be the package written into `folder` (an ASCII identifier that no importable module
    has: ``python -m numpy`` would run NumPy's), or None."""
    if name in _RESERVED:
        return f"is taken ({', '.join(_RESERVED)} are trainkit's, MindSpore's or the project's tests)"
    return package_name_problem(name, where=folder)


def _suggest(name: str, folder: Path) -> str:
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name).strip("_") or "project"
    for suggestion in (cleaned, f"my_{cleaned}", f"my_{cleaned}_project"):
        if _name_problem(suggestion, folder) is None:
            return suggestion
    return "my_project"


if __name__ == "__main__":
    sys.exit(main())
