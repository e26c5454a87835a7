"""``python -m trainkit.port MODULE:CLASS --out DIR``: a PyTorch model becomes MindSpore source, with its proof.

In one go: the model is traced with ``torch.fx`` and written out as readable MindSpore Cells
(:mod:`trainkit.bridge.port.source`), its weights (``--weights``, else its own initial ones) are converted onto
them, a model config (``_target_``) is written for the app, and the two are compared layer by layer on a fixed
batch. ``DIR`` gets::

    DIR/__init__.py
    DIR/model.py                  the Cells: yours to read, own and edit
    DIR/weights.ckpt              the converted weights (names identical to the state_dict's, batch norm renamed)
    DIR/buffers.npz               non-persistent buffers' values (timm's Swin masks), where the model has any
    DIR/conf/model/DIR.yaml       _target_: DIR.model.<Class>: hydra.searchpath=[file://DIR/conf] model=DIR
    DIR/compare.csv               every layer's output next to PyTorch's

With ``--into PROJECT`` (a project made by ``python -m trainkit.new NAME``), ``DIR`` is the name of a subpackage
of the project's package, ``PROJECT/NAME/DIR``, and the model config goes into the project's own
``PROJECT/NAME/conf/model/DIR.yaml`` (``_target_: NAME.DIR.model.<Class>``): ``python -m NAME model=DIR`` trains it.

Anything the port does not cover stops it before anything is written (exit 2), listing every unsupported
layer, function and method with each place it is used. Exit 1 when the comparison finds a layer beyond the
tolerance (the files are kept, to inspect), 0 when every layer agrees.

This package is the command (this module) and its parts, one concern each: ``trace`` (one ``forward`` traced with
``torch.fx``), ``source`` (the module tree as Cell classes), ``code`` and ``names`` (a line's pieces, its variables'
names), what is written for each PyTorch thing (``layers``, ``transformers``, ``operators``, ``windows``,
``classes``, ``buffers``, merged by ``tables``), the top class's constructor arguments (``arguments``, ``depth``,
``nested``) and tied weights (``ties``). The parts import one another, never the command.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np

from trainkit import configs
from trainkit.app.finetune import TIED_WEIGHTS
from trainkit.bridge.compare import (
    DEFAULT_TOLERANCE,
    compare_layers,
    first_divergence,
    fixed_batch,
    import_model,
    load_torch_weights,
    parse_arguments,
    write_table,
)
from trainkit.bridge.convert import convert_state_dict
from trainkit.bridge.port import code as port_code
from trainkit.bridge.port.arguments import constructor_values
from trainkit.bridge.port.source import PortFailure, generate, problem_lines
from trainkit.bridge.port.ties import tied_parameters
from trainkit.bridge.port.trace import masked, pad_mask_of, with_padding
from trainkit.bridge.state_dict import StateDict
from trainkit.bridge.torch_import import import_torch
from trainkit.checks import package_name_problem
from trainkit.checks.generated_code import check_generated
from trainkit.errors import CheckpointError, ConfigError, DataError
from trainkit.models.dropout import Dropout, DropPath
from trainkit.rundir.weights import load_weights, write_checkpoint

MODEL_FILE = "model.py"
WEIGHTS_FILE = "weights.ckpt"
TABLE_FILE = "compare.csv"
#: Bytes port holds per input value, at most: 4 (float32) times the copies of the batch and of what each layer makes
#: of it: NumPy's float64 draw, torch's and MindSpore's forwards, every layer's output on both sides for the table.
BYTES_PER_INPUT_VALUE = 4 * 16


def parse_shape(text: str) -> List[int]:
    """``3,32,32`` as [3, 32, 32]."""
    try:
        shape = [int(part) for part in text.split(",")]
    except ValueError:
        shape = []
    if not shape or any(size <= 0 for size in shape):
        raise ConfigError(f"--input-shape {text!r} is not valid: give one sample's shape, e.g. 3,32,32 for an image "
                          "or 12 for 12 token ids (with --input-ints)")
    return shape


def available_memory() -> int:
    """Bytes of memory this process can still take: the system's available memory (``MemAvailable``, else the free
    pages ``os.sysconf`` counts), less where a cgroup's limit is lower (a container)."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):  # no sysconf (Windows): no bound from memory
            available = None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available if available is not None else 2 ** 63


def check_batch(batch_size: int, input_shape: Sequence[int], available: Optional[int] = None) -> None:
    """Refuse a batch that port could not hold, before anything is allocated or written: its values times
    :data:`BYTES_PER_INPUT_VALUE` against `available` bytes (default :func:`available_memory`)."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size} is no batch: give a --batch-size from 1 (default 2)")
    values = batch_size * math.prod(input_shape)
    needed = values * BYTES_PER_INPUT_VALUE
    available = available_memory() if available is None else available
    if needed > available:
        raise ConfigError(f"--input-shape {','.join(map(str, input_shape))} with --batch-size {batch_size} is "
                          f"{values:,} input values: port needs about {_bytes(needed)} for them ({values:,} x "
                          f"{BYTES_PER_INPUT_VALUE} bytes), more than the {_bytes(available)} of memory available: "
                          "give a smaller --batch-size (default 2) or one sample's --input-shape")


def _bytes(count: int) -> str:
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def load_generated(path: Path, name: str) -> Any:
    """The module at `path`, imported under `name` (the package ``DIR.model`` the model config names)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def port(target: str, arguments: Dict[str, Any], out: Path, input_shape: List[int], weights: Optional[Path] = None,
         key: Optional[str] = None, input_ints: Optional[int] = None, batch_size: int = 2, seed: int = 0,
         tolerance: float = DEFAULT_TOLERANCE, force: bool = False, into: Optional[Path] = None) -> int:
    """Port `target` (``MODULE:CLASS`` with `arguments`) into `out`, or into the project `into` as its subpackage
    `out`; the exit status (see the module)."""
    torch = import_torch()  # torchvision importable beside it: timm:create_model imports it

    check_batch(batch_size, input_shape)  # before the model is built, the batch drawn or a folder made
    project = find_project(into) if into is not None else None
    if project is not None:
        out = project[1] / out.name
    package = out.resolve().name
    module_name = f"{project[0]}.{package}" if project else package
    problem = (package_name_problem(package, where=out.resolve().parent) if not project else
               None if package.isascii() and package.isidentifier() else "is not an ASCII identifier")
    if problem:
        raise ConfigError(f"--out {out}: the folder becomes the Python package {package!r}, which {problem}: "
                          "choose another folder name (ASCII letters, digits and _)")
    shipped = Path(configs.__file__).parent / "model" / f"{package}.yaml"
    if shipped.is_file():
        raise ConfigError(f"--out {out}: model={package} is one of trainkit's own model configs, which would hide "
                          "the ported one: choose another folder name")
    config = (project[1] if project else out) / "conf" / "model" / f"{package}.yaml"
    if project and config.exists() and not force:
        raise ConfigError(f"--into {into}: the project has a model config {package} already ({config}): choose "
                          "another --out name, or --force to replace it")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise ConfigError(f"--out {out} exists and is not empty: choose another folder, or --force to replace the "
                          "files port writes there")
    model = import_model(target, arguments, option="MODEL")
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{target} returned a {type(model).__name__}, not a torch.nn.Module")
    if weights is not None:
        load_torch_weights(model, weights, key)
    model.eval()
    shape = [batch_size, *input_shape]
    try:
        batch = (np.random.default_rng(seed).integers(0, input_ints, shape) if input_ints
                 else fixed_batch(shape, seed))
        mask = pad_mask_of(model) if input_ints else None
        if mask is not None and 0 <= mask.pad_id < input_ints:  # traced and compared padded, as a tokenizer pads
            batch = with_padding(batch, mask)
    except (MemoryError, ValueError, OverflowError) as error:  # NumPy's: too large to allocate, or no size at all
        raise ConfigError(f"--input-shape {','.join(map(str, input_shape))} with --batch-size {batch_size} is no batch "
                          f"this machine can build ({_first_line(error)}): give one sample's shape and a --batch-size "
                          "from 1 (default 2)") from None
    try:
        with torch.no_grad():
            model(torch.from_numpy(batch))
    except Exception as error:  # whatever the user's forward raises on an input it does not take
        raise ConfigError(f"{target} does not run on a batch of shape {'x'.join(map(str, shape))} "
                          f"({'token ids' if input_ints else 'floats'}): {_first_line(error)}; give the shape of "
                          "one sample with --input-shape (and --input-ints N for token ids)") from error
    ported = generate(model, target, lambda changed: import_model(target, {**arguments, **changed}, option="MODEL"),
                      constructor_values(factory_of(target), arguments), torch.from_numpy(batch))
    if ported.problems:
        for line in problem_lines(ported.problems):
            print(line)
        raise ConfigError(f"{target} cannot be ported: {len(problem_lines(ported.problems))} unsupported layers, "
                          "functions or options (listed above); nothing was written")
    init = port_code.docstring(f"{target} ported to MindSpore by python -m trainkit.port.") + "\n"
    check_generated({MODEL_FILE: ported.source, "__init__.py": init}, by="port")  # the last check: then files
    aliases = dict(tied_parameters(model))  # a second name of one Parameter: the ported model holds it once
    state = {name: value.detach().cpu().float().numpy() if value.is_floating_point() else value.cpu().numpy()
             for name, value in model.state_dict().items() if name not in aliases}

    out.mkdir(parents=True, exist_ok=True)
    (out / "__init__.py").write_text(init, encoding="utf-8")
    (out / MODEL_FILE).write_text(ported.source, encoding="utf-8")
    ported.buffers.save(out)  # buffers.npz, which model.py reads when its Cells are built
    try:
        module = load_generated(out / MODEL_FILE, f"{module_name}.model")
        ms.set_seed(0)
        network = getattr(module, ported.top)()
    except Exception as error:  # a bug of port's: the generated Cell that failed, in one line
        raise PortFailure(f"the ported {ported.top} cannot be built: {_failed_at(error, out / MODEL_FILE)}"
                          f"{_first_line(error)}; {out / MODEL_FILE} is kept to look at (a port bug, please report "
                          "it)") from error
    conversion = convert_state_dict(StateDict(weights or Path(f"{target} (its own weights)"), state,
                                              {name: str(value.dtype) for name, value in state.items()}),
                                    network, allow_missing=dropout_counters(network),
                                    description=f"{module_name}.model.{ported.top}")
    if not conversion.complete or conversion.only_in_source:
        print("\n".join(conversion.report()))
        raise CheckpointError(f"the ported {ported.top} does not take {target}'s weights (see above): a port bug, "
                              f"please report it; {out / MODEL_FILE} is kept to look at")
    load_weights(network, conversion.values, str(weights or target))
    write_checkpoint([{"name": name, "data": ms.Tensor(value)} for name, value in conversion.values.items()],
                     out / WEIGHTS_FILE)
    config.parent.mkdir(parents=True, exist_ok=True)
    command = (f"python -m {project[0]} model={package} model.pretrained={project[0]}/{package}/{WEIGHTS_FILE}"
               if project else f"python -m trainkit hydra.searchpath=[file://{out}/conf] model={package} "
               f"model.pretrained={out / WEIGHTS_FILE} data=...")
    config.write_text(port_code.comment(f"{target} ported by python -m trainkit.port; train it from PyTorch's "
                                        "weights with") + f"\n{port_code.comment(f'  {command}')}\n"
                      f"_target_: {module_name}.model.{ported.top}\n"
                      + "".join(f"{name}: {port_code.literal(list(value) if isinstance(value, tuple) else value)}\n"
                                for name, value in ported.arguments.items())  # YAML: no tuple
                      + tied_weights_lines(aliases), encoding="utf-8")
    try:
        with masked(model, ported.mask):  # PyTorch's called with the mask the ported model computes
            rows = compare_layers(network, model, batch)
    except Exception as error:  # noqa: BLE001 - whatever MindSpore raises, in one line naming the Cell
        print(f"the ported {ported.top} fails on the batch where PyTorch's runs: "
              f"{_failed_at(error, out / MODEL_FILE)}{_first_line(error)}; "
              f"{out / MODEL_FILE} is kept to look at (a port bug: please report it)")
        return 1
    diverged = first_divergence(rows, tolerance)
    paired = sum(row.max_abs_diff is not None for row in rows)
    write_table(rows, out / TABLE_FILE, None, {})
    print(f"ported {target} to {out / MODEL_FILE}: {len(ported.source.splitlines())} lines, classes "
          f"{', '.join(ported.classes)}")
    print(f"converted {len(conversion.matched)} parameters to {out / WEIGHTS_FILE}"
          + (f" ({conversion.mapping.renamed_batch_norm} norm names renamed)" if conversion.mapping.renamed_batch_norm
             else ""))
    print(f"model config: {config} (_target_: {module_name}.model.{ported.top})")
    if ported.arguments:
        print(f"{ported.top} takes PyTorch's constructor arguments "
              f"{', '.join(f'{name}={port_code.literal(value)}' for name, value in ported.arguments.items())} "
              "(in the model config)")
    if project:
        print(f"train it in the project: cd {into} && {command}")
    if aliases:
        print(f"tied weights, one Parameter each as in PyTorch: "
              f"{', '.join(f'{alias} is {name}' for alias, name in aliases.items())} (model.{TIED_WEIGHTS} in the "
              "model config: export --to torch writes each under both names)")
    if ported.mask is not None:
        print(f"{ported.top} computes its {ported.mask.argument} from the ids: {ported.mask.describe()}, the "
              f"model's config.pad_token_id (compared with PyTorch's called with that mask)")
    if ported.specialised:
        print(f"holds for inputs of shape {'x'.join(map(str, input_shape))} only: the forward of "
              f"{_listing(ported.specialised)} branches on sizes or arguments (see the comments in {out / MODEL_FILE})")
    if ported.training_paths:
        print(f"eval mode's path only: the forward of {_listing(ported.training_paths)} branches on self.training, "
              f"and what it does only in training mode is not ported (see the comments in {out / MODEL_FILE})")
    if diverged is not None:
        print(f"first layer beyond the tolerance ({tolerance:g} relative): {diverged.name}: max abs diff "
              f"{diverged.max_abs_diff:.3g}, relative {diverged.max_rel_diff:.3g} (every layer in {out / TABLE_FILE})")
        return 1
    print(f"agree: {paired} layers paired with PyTorch on a batch of shape {'x'.join(map(str, shape))}, every one "
          f"within {tolerance:g} relative")
    return 0


def tied_weights_lines(aliases: Dict[str, str]) -> str:
    """The model config's record of the tied weights (``model.tied_weights``: PyTorch's second name of each shared
    Parameter, then the name the checkpoint keeps it under), which a run stores and ``export --to torch`` reads to
    write the Parameter under both names, as PyTorch's ``state_dict`` has it; nothing without ties."""
    if not aliases:
        return ""
    pairs = [[alias, name] for alias, name in aliases.items()]
    return (port_code.comment("one Parameter under two PyTorch names: export --to torch writes it under both") + "\n"
            + f"{TIED_WEIGHTS}: {port_code.literal(pairs)}\n")


def factory_of(target: str) -> Any:
    """The class or function ``MODULE:NAME`` names (imported already by import_model)."""
    module, _, name = target.partition(":")
    return getattr(sys.modules[module], name)


def find_project(folder: Path) -> Tuple[str, Path]:
    """(name, package folder) of the project at `folder`, made by ``python -m trainkit.new``: the one package
    there with a ``__main__.py`` and a ``conf/`` folder."""
    if not folder.is_dir():
        raise ConfigError(f"--into {folder} is not a folder: give a project made by python -m trainkit.new NAME")
    found = [path.parent for path in sorted(folder.glob("*/__main__.py")) if (path.parent / "conf").is_dir()
             and path.parent.name.isidentifier()]
    if len(found) != 1:
        raise ConfigError(f"--into {folder} is not a project made by python -m trainkit.new: it needs one package "
                          f"with __main__.py and conf/ (found {len(found)})")
    return found[0].name, found[0]


def dropout_counters(network: ms.nn.Cell) -> List[str]:
    """The names of the call counters of `network`'s trainkit random layers (Dropout, DropPath): MindSpore-side
    state that no PyTorch state_dict holds, they start at 0."""
    return [parameter.name for cell in network.cells_and_names() if isinstance(cell[1], (Dropout, DropPath))
            for parameter in cell[1].get_parameters(expand=False)]


def _listing(items: List[str], count: int = 3) -> str:
    return ", ".join(items[:count]) + (f" and {len(items) - count} more" if len(items) > count else "")


def _failed_at(error: BaseException, source: Path) -> str:
    """``in Bottleneck.construct (model.py line 40): `` for the innermost frame of the generated file, else ''."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if Path(frame.filename) == source]
    if not frames:
        return ""
    frame = frames[-1]
    owner = next((line.split()[1].split("(")[0] for line in reversed(
        source.read_text(encoding="utf-8").splitlines()[:frame.lineno]) if line.startswith("class ")), "")
    return f"in {owner + '.' if owner else ''}{frame.name} ({source.name} line {frame.lineno}): "


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(error).__name__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.port MODULE:CLASS --out DIR --input-shape SHAPE [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.port",
        description="Write a PyTorch model as readable MindSpore source (traced with torch.fx), convert its weights, "
                    "write a model config for python -m trainkit, and compare the two layer by layer. Exit 0: "
                    "agree, 1: a layer differs, 2: bad input or something unsupported (nothing written).")
    parser.add_argument("model", help="the PyTorch model as MODULE:CLASS (or a function returning one)")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="an argument of the class (repeat), e.g. num_classes=10")
    parser.add_argument("--weights", type=Path, help="its weights (.pth/.safetensors); default: its own initial ones")
    parser.add_argument("--key", help="the entry of a wrapping PyTorch checkpoint that holds the state dict")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write: it becomes a Python package "
                                                                "(with --into, the package's name in the project)")
    parser.add_argument("--into", type=Path, metavar="PROJECT",
                        help="a project made by python -m trainkit.new: the package goes into its package and the "
                             "model config into its conf/model, so that python -m PROJECT model=OUT trains it")
    parser.add_argument("--input-shape", required=True, help="one sample's shape for the comparison, e.g. 3,32,32")
    parser.add_argument("--input-ints", type=int, metavar="N", help="the input is token ids in [0, N)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the comparison's batch")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"largest relative difference per layer (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--force", action="store_true", help="replace port's files in a folder that has them")
    args = parser.parse_args(argv)
    try:
        import_torch()  # the check that the extra is installed
    except ImportError:
        print("trainkit: error: port needs PyTorch: pip install 'trainkit[torch]'", file=sys.stderr)
        return 2
    try:
        return port(args.model, parse_arguments(args.arg, "--arg"), args.out, parse_shape(args.input_shape),
                    args.weights, args.key, args.input_ints, args.batch_size, args.seed, args.tolerance, args.force,
                    args.into)
    except (ConfigError, DataError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
