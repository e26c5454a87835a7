"""``python -m trainkit.export CKPT|RUN_DIR model.mindir|model.onnx``: a file serving runtimes load, checked before
it is written as done.

The network is built for inference (evaluation mode, the run's ``amp.level``, float32 outputs) with
``model.conv_impl=native`` where the model has the key: trainkit's own convolutions (``unfold``,
``channel_major``: custom kernels) compute the same numbers but do not export, MindSpore's ``nn.Conv2d`` does. The
input shape is the data's: that of the first batch of its evaluation set. ``mindspore.export`` (MindIR) or
``mindspore.onnx.export`` writes the file under a temporary name beside the output; then

- a MindIR is loaded back with ``mindspore.load`` + ``nn.GraphCell``, an ONNX file run by onnxruntime, on the
  first :data:`CHECK_SAMPLES` inputs of the data's ``--split`` set;
- their outputs must agree with trainkit's own evaluation of those inputs (the network exactly as the run
  built it, its ``conv_impl`` included): the largest difference at most ``tolerance x max(1, largest |output|)``.

Only then is the file renamed into place. Otherwise nothing is left behind, and one line says by how much.

Where MindSpore's ONNX exporter has no operator for a layer (HSwish, HSigmoid, the exact GELU's Erf, padded or
ceil_mode max and average pooling, adaptive pooling, GroupNorm, a one-sided clamp), the ONNX file holds an
equivalent composition of operators it has (:mod:`trainkit.tools.export_twins`), swapped in while the file is
written and checked like any other; the network, its checkpoint and the MindIR form are unchanged.

A MindIR takes any batch size (its first dimension is dynamic); MindSpore exports ONNX with static shapes only,
so an ONNX file takes batches of ``--batch-size`` (default 1).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import mindspore as ms
import numpy as np
from mindspore import nn

from trainkit.app.build import DEFAULT_CONV_IMPL, DEFAULT_LAYER_IMPL
from trainkit.errors import ConfigError, DataError
from trainkit.process import signals
from trainkit.rundir.output_file import written_whole
from trainkit.rundir.trust import add_trust_argument
from trainkit.rundir.weights import WEIGHTS, refuse_existing
from trainkit.tools import export_ops, export_twins
from trainkit.tools.inference import data_batch, load_trained, outputs

FORMATS = {".mindir": "MINDIR", ".onnx": "ONNX"}
DEFAULT_TOLERANCE = 1e-4
CHECK_SAMPLES = 16


class ExportMismatch(RuntimeError):
    """The exported file's outputs differ from trainkit's evaluation by more than the tolerance; nothing was kept."""


@dataclass
class Exported:
    """What :func:`export_model` wrote and how well it agrees with trainkit's evaluation."""

    path: Path
    file_format: str
    input_shape: tuple
    samples: int
    max_difference: float
    allowed: float
    conv_impl: Optional[str]
    composed: Tuple[str, ...] = ()  # the layers an ONNX file holds as compositions (export_twins), by class


@dataclass
class Checked:
    """A file :func:`write_checked` kept: its input shape, how far it is from the reference, what was composed."""

    input_shape: tuple
    max_difference: float
    allowed: float
    composed: Tuple[str, ...]


def check_output(output: Path, force: bool) -> str:
    """The format `output`'s suffix names; ConfigError for another suffix or a parent that is a file, and
    CheckpointError for an existing `output` without `force`, before any work."""
    file_format = FORMATS.get(output.suffix.lower())
    if file_format is None:
        raise ConfigError(f"{output}: a deployable model is written as .mindir or .onnx (or .ckpt for an inference "
                          "checkpoint, .safetensors/.pth with --to torch)")
    for parent in output.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{output}: {parent} is a file, not a folder: choose an output in a folder")
    refuse_existing(output, force)
    return file_format


def export_model(target: Union[str, Path], output: Union[str, Path], overrides: Sequence[str] = (),
                 weights: str = "live", which: str = "best", trust: Sequence[str] = (), batch_size: int = 1,
                 tolerance: float = DEFAULT_TOLERANCE, split: str = "val", force: bool = False) -> Exported:
    """Export the network of `target` (a checkpoint, or a run directory's best or newest) to `output`.

    Raises:
        ConfigError, DataError, CheckpointError: bad input, before anything compiles (one line each).
        ExportMismatch: the exported file disagrees with trainkit's evaluation; `output` is not written.
    """
    output = Path(output).expanduser()
    file_format = check_output(output, force)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1; got {batch_size}")
    signals.phase("build")
    trained = load_trained(Path(target).expanduser(), overrides, weights, which, trust, work_dir=output.parent)
    # The app swaps a network's nn.Conv2d, exact nn.GELU and nn.MaxPool2d where the config has no conv_impl or
    # layer_impl too (a ported or user model): rebuilt with MindSpore's own layers, which export, unless it trained
    # with them.
    conv_impl = str(trained.cfg.model.get("conv_impl", DEFAULT_CONV_IMPL))
    layer_impl = str(trained.cfg.model.get("layer_impl", DEFAULT_LAYER_IMPL))
    network = trained.rebuilt(conv_impl="native", layer_impl="native") if conv_impl != "native" or \
        layer_impl != "native" else trained.network
    batch = data_batch(trained.data, split, CHECK_SAMPLES)
    signals.phase("compile")
    reference = outputs(trained.network, batch)
    checked = write_checked(network, batch, reference, output, file_format, batch_size, tolerance,
                            f"{len(batch)} inputs of the {split} set")
    return Exported(output, file_format, checked.input_shape, len(batch), checked.max_difference, checked.allowed,
                    conv_impl, checked.composed)


def write_checked(network: nn.Cell, batch: np.ndarray, reference: np.ndarray, output: Path, file_format: str,
                  batch_size: int = 1, tolerance: float = DEFAULT_TOLERANCE, inputs: str = "the inputs") -> Checked:
    """Write `network` (evaluation mode) to `output` as `file_format` (``MINDIR``/``ONNX``), run the file on `batch`
    and keep it only if its outputs are within `tolerance` x max(1, largest |output|) of `reference`.

    Raises:
        ConfigError, DataError: MindSpore cannot export the network, or wrote no file (nothing is left).
        ExportMismatch: the file's outputs differ by more; `output` is not written.
    """
    shape = ((None,) if file_format == "MINDIR" else (batch_size,)) + tuple(batch.shape[1:])
    with written_whole(output, output.suffix.lower()) as temporary:  # MindSpore's export adds a missing suffix
        signals.phase("write")
        composed = _export(network, shape, batch.dtype, temporary, file_format, output)
        signals.phase("check")
        got = _run_mindir(temporary, batch) if file_format == "MINDIR" else _run_onnx(temporary, batch, batch_size)
        difference = float(np.max(np.abs(got.astype(np.float64) - reference))) if got.shape == reference.shape \
            else float("inf")
        allowed = tolerance * max(1.0, float(np.max(np.abs(reference))))
        if not difference <= allowed:
            raise ExportMismatch(
                f"{output}: the exported model's outputs differ from trainkit's evaluation by {difference:.3g} "
                f"(allowed: {allowed:.3g} = {tolerance:g} x max(1, largest |output|)) on {inputs}"
                f"{_shapes(got, reference)}{_composed(composed)}: nothing was written")
    return Checked(shape, difference, allowed, composed)


def _composed(composed: Tuple[str, ...]) -> str:
    return f" (composed for ONNX: {', '.join(composed)})" if composed else ""


def _shapes(got: np.ndarray, reference: np.ndarray) -> str:
    return "" if got.shape == reference.shape else f" (shapes {got.shape} and {reference.shape})"


def _export(network: nn.Cell, shape: tuple, dtype: np.dtype, path: Path, file_format: str,
            output: Path) -> Tuple[str, ...]:
    """Write `network` to `path` (a temporary name); errors name `output`, the file the user asked for. An ONNX
    file gets the export twins of the layers its exporter lacks: their classes are returned, each with its count."""
    dtype_ms = ms.Tensor(np.zeros((), dtype)).dtype
    example = (ms.Tensor(shape=list(shape), dtype=dtype_ms) if None in shape
               else ms.Tensor(np.zeros(shape, dtype)))
    try:
        if file_format == "ONNX":  # mindspore.export's ONNX path is deprecated in 2.10 (and says so on every export)
            from mindspore.onnx import export as export_onnx

            with onnx_twins(network) as swapped:
                export_onnx(network, example, file_name=str(path))
        else:
            swapped = []
            ms.export(network, example, file_name=str(path), file_format=file_format)
    except (RuntimeError, ValueError, TypeError) as error:  # an operator the format has no counterpart for
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"{output}: MindSpore cannot export this network as {file_format} ({reason}); nothing "
                          "was written") from error
    if not path.is_file():  # mindspore.onnx.export logs a failed write (a full disk) and returns
        raise DataError(f"{output}: MindSpore's export wrote no file (its reason is in its log line above); "
                        "nothing was written")
    counts = collections.Counter(swapped)
    return tuple(name if count == 1 else f"{count} {name}" for name, count in sorted(counts.items()))


def _run_mindir(path: Path, batch: np.ndarray) -> np.ndarray:
    """The MindIR loaded back as MindSpore serves it: ``mindspore.load`` + ``nn.GraphCell``."""
    graph = nn.GraphCell(ms.load(str(path)))
    return graph(ms.Tensor(batch)).asnumpy()


def _run_onnx(path: Path, batch: np.ndarray, batch_size: int) -> np.ndarray:
    """The ONNX file run by onnxruntime, `batch_size` inputs at a time (the last chunk padded by repetition)."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ConfigError("checking an ONNX export needs onnxruntime, which is not installed: pip install "
                          "'trainkit[onnx]' (or pip install onnxruntime)") from error
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    results = []
    for start in range(0, len(batch), batch_size):
        chunk = batch[start:start + batch_size]
        padded = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - len(chunk), axis=0)])
        results.append(session.run(None, {name: padded})[0][:len(chunk)])
    return np.concatenate(results)


COMPOSED_FUNCTIONS = ("hardswish", "hardsigmoid", "gelu", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                      "adaptive_max_pool2d", "pad", "unbind", "clamp", "clip")  # trainkit.tools.export_ops' own


def _composed_functions(module) -> List[str]:
    """``ops.gelu`` and the like: the composed functions `module`'s source calls (for the report; a call of the
    tanh GELU, which exports as it is, is named too)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return []
    return [f"ops.{name}" for name in COMPOSED_FUNCTIONS if re.search(rf"\bops\.{name}\(", source)]


def _replace(parent: nn.Cell, key: str, child: nn.Cell) -> None:
    """`parent`'s child `key` becomes `child`, with no parameter renamed (``setattr`` and a SequentialCell's
    ``__setitem__`` prefix the new child's parameter names)."""
    parent.insert_child_to_cell(key, child)
    if isinstance(parent, nn.SequentialCell):
        parent.cell_list = list(parent.name_cells().values())


@contextlib.contextmanager
def onnx_twins(network: nn.Cell) -> Iterator[List[str]]:
    """While inside, `network`'s layers that ONNX export lacks an operator for are their twins, and the modules that
    define its Cells call :mod:`trainkit.tools.export_ops` as ``ops``; yields what was composed: the swapped layers'
    classes and the ``ops.<function>`` names those modules call.
    Everything is put back on leaving, also after an error."""
    swapped: List[Tuple[nn.Cell, str, nn.Cell]] = []
    patched, functions = [], []
    try:
        for _, cell in list(network.cells_and_names()):
            module = sys.modules.get(type(cell).__module__)
            if (module is not None and getattr(module, "ops", None) is ms.ops
                    and not module.__name__.startswith(("mindspore", "trainkit.tools"))
                    and all(module is not done for done in patched)):
                module.ops = export_ops
                patched.append(module)
                functions.extend(_composed_functions(module))
            for key, child in list(cell.name_cells().items()):
                twin = export_twins.twin_of(child) if child is not None else None
                if twin is not None:
                    twin.set_train(child.training)
                    _replace(cell, key, twin)
                    swapped.append((cell, key, child))
        yield [type(child).__name__ for _, _, child in swapped] + functions
    finally:
        for parent, key, child in reversed(swapped):
            _replace(parent, key, child)
        for module in patched:
            module.ops = ms.ops


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.export CKPT|RUN_DIR OUT.mindir|OUT.onnx [key=value...] [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.export",
        description="Export a trained network as MindIR or ONNX (by the output's suffix), built for inference with "
                    "model.conv_impl=native; the file is kept only if its outputs agree with trainkit's evaluation.")
    parser.add_argument("target", help="a checkpoint file, or a run directory (its best or newest checkpoint)")
    parser.add_argument("output", help="the file to write: OUT.mindir or OUT.onnx")
    parser.add_argument("overrides", nargs="*", help="key=value changes to the saved config (or Hydra overrides "
                                                     "for an exported/converted checkpoint)")
    parser.add_argument("--weights-of", "--weights", choices=WEIGHTS, default="live", dest="weights",
                        help="live: the trained weights (default); ema: the EMA shadow weights")
    parser.add_argument("--checkpoint", choices=("best", "newest"), default="best",
                        help="for a run directory: best.ckpt (default) or the newest epoch checkpoint")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="the batch an ONNX file takes (static shapes; default 1); a MindIR takes any")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"largest difference from trainkit's evaluation, times max(1, largest |output|) "
                             f"(default {DEFAULT_TOLERANCE:g})")
    parser.add_argument("--split", choices=("val", "test"), default="val",
                        help="the data whose first inputs check the file: val (default) or test")
    parser.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    add_trust_argument(parser)
    args = parser.parse_intermixed_args(argv)
    try:
        done = export_model(args.target, args.output, args.overrides, args.weights, args.checkpoint, args.trust,
                            args.batch_size, args.tolerance, args.split, args.force)
    except (ConfigError, DataError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    except ExportMismatch as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 1
    shape = "x".join("N" if size is None else str(size) for size in done.input_shape)
    native = f", conv_impl native (trained with {done.conv_impl})" if done.conv_impl != "native" else ""
    native += f", composed for ONNX: {', '.join(done.composed)}" if done.composed else ""
    print(f"wrote {done.path}: {done.file_format}, input {shape}{native}, {args.weights} weights; checked on "
          f"{done.samples} inputs of the {args.split} set: largest difference from trainkit's evaluation "
          f"{done.max_difference:.3g} (allowed {done.allowed:.3g})")
    return 0
