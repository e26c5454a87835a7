"""``python -m trainkit.evaluate CHECKPOINT|RUN_DIR [OVERRIDES...]``: evaluate weights without training.

What it evaluates, and the config the network and the data are built from:

- a run directory: its ``checkpoints/best.ckpt`` (``--checkpoint newest``: the newest epoch checkpoint), built
  from the run's ``.hydra/config.yaml``;
- a training checkpoint (``trainkit-<epoch>_<step>.ckpt``, ``best.ckpt``): the config saved inside it;
- an exported or converted checkpoint: the config the overrides compose (``recipe=... model.num_classes=10``).

``key=value`` overrides change a saved config (``data.root=...``, ``data.eval_batch_size=256``). Live or EMA
weights (``--weights ema``, a training checkpoint's). The metrics are the app's (``accuracy``, ``loss``: the mean
of the batches' mean losses, as MindSpore's ``Loss``), plus per-class accuracy and the confusion matrix (rows:
true class, columns: predicted; the classes named as the run stored them), printed and written as JSON.
``--split val`` (the default) evaluates the data's evaluation (validation) set, ``--split test`` its held-out
``test_dataset()``. Under ``msrun`` (with ``parallel=data_parallel``)
each rank evaluates the whole evaluation set, as the app's evaluation does, and rank 0 writes the file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from mindspore.train import Accuracy, Callback, ConfusionMatrix, Model
from omegaconf import DictConfig, OmegaConf

from trainkit.app import build, run
from trainkit.app.tool_config import build_network, saved_config, tool_config
from trainkit.distributed.parallel import ParallelSetup, launched_by_msrun, setup_parallel
from trainkit.errors import CheckpointError, ConfigError, DataError
from trainkit.rundir.checkpoint_file import BEST, find_checkpoint, read_training_checkpoint, stored_config  # noqa: F401
from trainkit.rundir.class_names import class_names_of, load_class_names
from trainkit.rundir.output_file import write_text_whole
from trainkit.rundir.trust import add_trust_argument
from trainkit.rundir.weights import WEIGHTS, load_weights, network_weights, refuse_existing
from trainkit.step.mixed_precision import Float32EvalCell

log = logging.getLogger("trainkit")


def evaluation_config(target: Path, checkpoint: Path, overrides: Sequence[str],
                      trust: Sequence[str] = ()) -> DictConfig:
    """The run's saved config (run directory), the checkpoint's own (training checkpoint), else the overrides'.

    A saved config may name only trainkit's own targets and those under the modules in `trust`
    (:mod:`trainkit.rundir.trust`): a checkpoint or a run directory is data, never code.
    """
    if target.is_dir():
        run_dir = target.parent if target.name == "checkpoints" else target
        return saved_config(run_dir, overrides, trust)
    if any(item.startswith("run=") for item in overrides):
        return tool_config(overrides, trust)
    try:
        saved = stored_config(checkpoint)  # a training checkpoint's or best.ckpt's own config
    except CheckpointError:
        saved = None  # not a file trainkit can read a config from: the overrides' config, and its load says why
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    if saved is None and run_dir is not None and (run_dir / ".hydra" / "config.yaml").is_file():
        return saved_config(run_dir, overrides, trust)  # a best.ckpt written before it held the config: its run's
    if saved is None:
        return tool_config(overrides)  # an exported or converted checkpoint: no config inside
    with tempfile.TemporaryDirectory() as folder:  # the saved config, through the same override rules as run=
        (Path(folder) / ".hydra").mkdir()
        OmegaConf.save(saved, Path(folder) / ".hydra" / "config.yaml")
        return saved_config(Path(folder), overrides, trust, source=f"the config stored in checkpoint {checkpoint}")


class EvalProgress(Callback):
    """A log line every `every` batches of the evaluation, and one at its end."""

    def __init__(self, batches: int, every: int = 20):
        super().__init__()
        self.batches, self.every, self.done = batches, max(1, every), 0
        self.start = time.perf_counter()

    def on_eval_step_end(self, run_context) -> None:
        self.done += 1
        if self.done % self.every == 0 and self.done < self.batches:
            log.info("evaluating: batch %d/%d (%.1f s)", self.done, self.batches, time.perf_counter() - self.start)

    def on_eval_end(self, run_context) -> None:
        log.info("evaluated %d batches in %.1f s", self.done, time.perf_counter() - self.start)


def evaluate(cfg: DictConfig, checkpoint: Path, weights: str = "live",
             parallel: Optional[ParallelSetup] = None, split: str = "val") -> Dict[str, Any]:
    """Evaluate `checkpoint`'s weights in the network `cfg` builds, on `cfg.data`'s evaluation set (`split`
    ``val``) or its held-out test set (``test``).

    Returns:
        ``accuracy``, ``loss``, ``samples``, ``per_class_accuracy``, ``confusion_matrix`` (rows: true class) and
        where the numbers came from.
    """
    values = network_weights(checkpoint, weights)  # a bad file stops before the data is read
    data = build.instantiate_group("data", cfg.data)
    data.prepare()
    if split == "test" and not callable(getattr(data, "test_dataset", None)):
        raise ConfigError(f"--split test: the data module {type(data).__name__} has no test_dataset(); use "
                          "--split val")
    eval_set = data.test_dataset() if split == "test" else data.eval_dataset()
    network = build_network(cfg, data)
    load_weights(network, values, str(checkpoint))
    loss_fn = build.build_loss_fn(cfg)
    with tempfile.TemporaryDirectory() as folder, run.inside(Path(folder)):  # amp=O1 writes its rewrite here
        backbone = build.build_loss_network_for(cfg, network, loss_fn).backbone
    with_metrics = OmegaConf.create(OmegaConf.to_container(cfg))
    OmegaConf.update(with_metrics, "trainer.evaluate", True, merge=False)  # the run's metrics, even if it had none
    metrics = build.build_metrics(with_metrics)
    num_classes = (build.model_args_from_data(cfg.model, data).get("num_classes") or cfg.model.get("num_classes")
                   or getattr(data, "num_classes", None))
    classification = num_classes is not None and any(isinstance(m, Accuracy) for m in metrics.values())
    if classification:
        metrics["confusion"] = ConfusionMatrix(int(num_classes))
    model = Model(backbone, eval_network=Float32EvalCell(backbone, loss_fn), eval_indexes=[0, 1, 2], metrics=metrics)
    batches = eval_set.get_dataset_size()
    callbacks = [EvalProgress(batches)] if parallel is None or parallel.writer else []
    with np.errstate(invalid="ignore", divide="ignore"):  # ConfusionMatrix also divides by empty columns
        result = model.eval(eval_set, callbacks=callbacks, dataset_sink_mode=False)
    output: Dict[str, Any] = {"checkpoint": str(checkpoint), "weights": weights, "split": split,
                              "model": str(cfg.model.get("_target_")), "data": type(data).__name__}
    output.update({name: float(value) for name, value in result.items() if name != "confusion"})
    if classification:
        confusion = np.asarray(result["confusion"], dtype=np.int64)
        output["samples"] = int(confusion.sum())
        output["per_class_accuracy"] = [float(v) for v in confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)]
        output["confusion_matrix"] = confusion.tolist()
        names = stored_class_names(checkpoint, data)
        if names is not None and len(names) == len(confusion):
            output["class_names"] = names
    return output


def stored_class_names(checkpoint: Path, data: Any) -> Optional[List[str]]:
    """The class names the run stored (the checkpoint's, else its run directory's ``class_names.json``), else the
    data module's own ``class_names``; None when neither names them."""
    return load_class_names(checkpoint) or class_names_of(data)


def default_output(checkpoint: Path, weights: str, split: str = "val") -> Path:
    """``<checkpoint folder>/<stem>-<weights>.eval.json`` (``-<weights>-test.eval.json`` for the test set)."""
    return checkpoint.with_name(f"{checkpoint.stem}-{weights}{'-test' if split == 'test' else ''}.eval.json")


def format_result(result: Dict[str, Any]) -> List[str]:
    scores = ", ".join(f"{name} {value:.4f}" for name, value in result.items()
                       if isinstance(value, float) and name != "per_class_accuracy")
    samples = f" on {result['samples']} samples" if "samples" in result else ""
    split = " on the test set" if result.get("split") == "test" else ""
    lines = [f"{result['checkpoint']} ({result['weights']} weights{split}): {scores}{samples}"]
    if "confusion_matrix" in result:
        matrix = result["confusion_matrix"]
        names = result.get("class_names") or [str(index) for index in range(len(matrix))]
        lines.append("per-class accuracy: " + ", ".join(f"{name}: {value:.3f}"
                                                          for name, value in zip(names, result["per_class_accuracy"])))
        width = max(len(str(value)) for row in matrix for value in row)
        label = max(len(name) for name in names)
        order = "" if "class_names" not in result else f", in the order {', '.join(names)}"
        lines.append(f"confusion matrix (rows: true class, columns: predicted{order}):")
        lines.extend(f"  {name:<{label}}  " + " ".join(f"{value:>{width}}" for value in row)
                     for name, row in zip(names, matrix))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.evaluate CHECKPOINT|RUN_DIR [OVERRIDES...] [--weights live|ema]``."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun runs the command as its scheduler too: it only serves
        from mindspore.communication import init

        init()
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.evaluate",
        description="Evaluate a checkpoint (training, exported or converted) or a run directory's best checkpoint "
                    "on the data's evaluation set, without training; metrics as JSON, per-class accuracy and the "
                    "confusion matrix included.")
    parser.add_argument("target", help="a checkpoint file, or a run directory (its best or newest checkpoint)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (for an exported/converted checkpoint), or "
                                                     "key=value changes to the saved config")
    parser.add_argument("--weights", choices=WEIGHTS, default="live",
                        help="live (default) or ema: a training checkpoint's EMA weights")
    parser.add_argument("--split", choices=("val", "test"), default="val",
                        help="val (default): the data's evaluation set; test: its held-out test_dataset()")
    parser.add_argument("--checkpoint", choices=("best", "newest"), default="best",
                        help="for a run directory: best.ckpt (default) or the newest epoch checkpoint")
    parser.add_argument("--output", type=Path, help="the JSON file to write (default: beside the checkpoint, "
                                                    "<stem>-<weights>.eval.json)")
    parser.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    add_trust_argument(parser)
    args = parser.parse_intermixed_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    try:
        target = Path(args.target).expanduser()
        checkpoint = find_checkpoint(target, args.checkpoint)
        output = args.output or default_output(checkpoint, args.weights, args.split)
        refuse_existing(output, args.force)
        cfg = evaluation_config(target, checkpoint, args.overrides, args.trust)
        run.set_context(cfg.trainer, output.parent)  # compiler dumps beside the output, not in the cwd
        if not launched_by_msrun():  # a data-parallel run's config evaluates in this one process
            OmegaConf.update(cfg, "parallel.mode", "stand_alone", merge=False)
        parallel = setup_parallel(cfg.parallel)
        result = evaluate(cfg, checkpoint, args.weights, parallel, args.split)
    except (ConfigError, DataError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    if parallel.writer:
        print("\n".join(format_result(result)))
        write_text_whole(output, json.dumps(result, indent=1))
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
