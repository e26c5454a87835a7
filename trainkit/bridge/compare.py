"""``python -m trainkit.compare WEIGHTS [OVERRIDES...]``: one fixed batch through the network, layer by layer.

The network is built from the overrides as a run builds it (or ``run=RUN_DIR``), given WEIGHTS (a MindSpore
checkpoint -- converted, exported or a training checkpoint -- or PyTorch weights, converted in memory), and run
in eval mode on one fixed batch (uniform in [-1, 1], ``--seed``; token ids in [0, N) with ``--input-ints N``; or
``--input x.npy``, whose integers stay integers). Forward hooks
(``Cell.register_forward_hook``, which needs PyNative mode) record every layer's output: a table row per layer
with its shape, dtype, mean, std, min, max and count of non-finite values, also written as CSV/JSON.

With the PyTorch side (``--torch-model mypkg.models:resnet50 --torch-arg num_classes=10``, its weights from
``--torch-weights`` or WEIGHTS itself), the same batch runs through both, layers are paired by name (torch's
module names through the same mapping as the weights), each row gets the largest absolute and relative
difference, and the first layer beyond ``--tolerance`` (relative to the layer's largest PyTorch value) is
named: where a wrong mapping, a padding or a pooling difference starts. Exit status 0 when every paired layer
agrees, 1 when one does not (a gate for scripts and CI), 2 for bad input.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import importlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
import yaml
from mindspore import nn
from omegaconf import OmegaConf

from trainkit.app.tool_config import describe_network, set_device, tool_config
from trainkit.bridge.convert import build_prepared, convert_state_dict
from trainkit.bridge.name_mapping import Rule, load_rules, map_names, module_name
from trainkit.bridge.state_dict import read_state_dict
from trainkit.bridge.torch_import import import_torch
from trainkit.data.input_file import open_input
from trainkit.errors import CheckpointError, ConfigError, DataError
from trainkit.rundir.output_file import write_text_whole, written_whole
from trainkit.rundir.parameter_fit import listing
from trainkit.rundir.trust import add_trust_argument
from trainkit.rundir.weights import load_weights, network_weights

DEFAULT_TOLERANCE = 1e-4
NETWORK = "(network)"  # the row of the whole network's output
MINDSPORE_SUFFIXES = (".ckpt",)


@dataclass
class LayerRow:
    """One layer's output on the batch (the n-th call of a layer reused in a forward is ``name#n``)."""

    name: str
    shape: str
    dtype: str
    mean: float
    std: float
    min: float
    max: float
    nonfinite: int
    max_abs_diff: Optional[float] = None
    max_rel_diff: Optional[float] = None
    torch_name: Optional[str] = None
    torch_shape: Optional[str] = None


def record_outputs(call: Callable[[], Any], modules: Sequence, register: Callable, to_numpy: Callable
                   ) -> Dict[str, np.ndarray]:
    """Run `call` with a forward hook on every (name, module) and return each output in the order produced.

    `to_numpy(output, name)` turns a module's output into an array."""
    outputs: Dict[str, np.ndarray] = {}
    handles = []
    for name, module in modules:
        def hook(_module, _inputs, output, name=name or NETWORK):
            if isinstance(output, dict) and callable(getattr(output, "to_tuple", None)):
                output = output.to_tuple()  # a transformers ModelOutput: its fields set, in order
            first = output[0] if isinstance(output, (tuple, list)) else output
            if first is None:  # nothing to compare (attention weights an attention did not compute)
                return
            key, count = name, 1
            while key in outputs:
                count += 1
                key = f"{name}#{count}"
            outputs[key] = to_numpy(first, name)
        handles.append(register(module, hook))
    try:
        call()
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def network_outputs(network: nn.Cell, batch: np.ndarray) -> Dict[str, np.ndarray]:
    """Every layer's output of `network` (eval mode, PyNative) on `batch`, keyed by cell name, in execution order.

    A model built with ``conv_impl=channel_major`` keeps its activations as (C, N, H, W) between layers; its cells'
    4-D outputs are given back as (N, C, H, W), the layout PyTorch's layers produce.
    """
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)  # forward hooks fire in PyNative mode only
    network.set_train(False)
    cells = list(network.cells_and_names())
    channel_major = [name for name, cell in cells if getattr(cell, "channel_major", False) is True]

    def to_numpy(tensor, name):
        value = tensor.asnumpy().copy()
        inside = any(name == prefix or not prefix or name.startswith(prefix + ".") for prefix in channel_major)
        return value.transpose(1, 0, 2, 3).copy() if inside and value.ndim == 4 else value

    try:
        return record_outputs(lambda: network(ms.Tensor(batch)), cells,
                              lambda cell, hook: cell.register_forward_hook(hook), to_numpy)
    finally:
        ms.set_context(mode=previous)


def torch_outputs(model: Any, batch: np.ndarray) -> Dict[str, np.ndarray]:
    """Every module's output of a torch `model` (eval mode, no grad) on `batch`, keyed by module name."""
    torch = import_torch()

    model.eval()
    with torch.no_grad():
        return record_outputs(lambda: model(torch.from_numpy(batch)), list(model.named_modules()),
                              lambda module, hook: module.register_forward_hook(hook),
                              lambda tensor, _name: tensor.detach().clone().float().numpy())


def layer_table(outputs: Dict[str, np.ndarray], reference: Optional[Dict[str, np.ndarray]] = None,
                reference_names: Optional[Dict[str, str]] = None) -> List[LayerRow]:
    """A row per layer of `outputs`; with `reference` (the PyTorch side keyed by network names), its differences.

    The relative difference is ``max |a - b| / max |b|`` over the layer (b: the reference), which stays meaningful
    where single values are near zero.
    """
    rows = []
    for name, value in outputs.items():
        finite = value[np.isfinite(value)].astype(np.float64) if value.size else np.zeros(0)
        stats = (finite.mean(), finite.std(), finite.min(), finite.max()) if finite.size else (np.nan,) * 4
        row = LayerRow(name, "x".join(map(str, value.shape)), str(value.dtype), *map(float, stats),
                       nonfinite=int(value.size - finite.size))
        if reference is not None and name in reference:
            other = reference[name]
            row.torch_name = (reference_names or {}).get(name, name)
            row.torch_shape = "x".join(map(str, other.shape))
            if other.shape == value.shape:
                difference = float(np.max(np.abs(value.astype(np.float64) - other))) if value.size else 0.0
                scale = float(np.max(np.abs(other))) if other.size else 0.0
                row.max_abs_diff = difference
                row.max_rel_diff = difference / scale if scale > 0 else (0.0 if difference == 0 else float("inf"))
            else:
                row.max_abs_diff = row.max_rel_diff = float("inf")
        rows.append(row)
    return rows


def first_divergence(rows: Sequence[LayerRow], tolerance: float = DEFAULT_TOLERANCE) -> Optional[LayerRow]:
    """The first row (in execution order) whose relative difference exceeds `tolerance` (NaN counts as beyond)."""
    for row in rows:
        if row.max_rel_diff is not None and not row.max_rel_diff <= tolerance:
            return row
    return None


def import_model(path: str, arguments: Dict[str, Any], option: str = "--torch-model") -> Any:
    """``package.module:factory`` called with `arguments` (a class or a function returning a torch module)."""
    module_path, colon, attribute = path.partition(":")
    if not colon or not module_path or not attribute:
        raise ConfigError(f"{option} {path!r} is not valid: give MODULE:NAME, e.g. mypkg.models:resnet50")
    with contextlib.suppress(ImportError):  # no PyTorch: the module's own import says what is missing
        import_torch()  # torchvision's schemas where its operators do not load, before the module imports it
    try:
        module = importlib.import_module(module_path)
    except ImportError as error:
        raise ConfigError(f"{option} {path}: cannot import {module_path} ({error}); run from the folder that "
                          "holds it or put it on PYTHONPATH") from error
    except Exception as error:  # noqa: BLE001 - the module's own code failed on import: one line, not its traceback
        hint = ("; torchvision's C++ operators do not load against this torch: install the torchvision release "
                "built for it (see the PyTorch install matrix)" if "torchvision::" in str(error) else "")
        raise ConfigError(f"{option} {path}: importing {module_path} failed: {type(error).__name__}: "
                          f"{' '.join(str(error).split())[:300]}{hint}") from error
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ConfigError(f"{option} {path}: {module_path} has no {attribute}")
    try:
        return factory(**arguments)
    except Exception as error:  # noqa: BLE001 - a wrong argument (TypeError) or the factory's own check (timm's
        # "Unknown model"): one line naming the call
        raise ConfigError(f"{option} {path}: {attribute}({_arguments(arguments)}) failed: {type(error).__name__}: "
                          f"{' '.join(str(error).split())[:300]}") from error


def load_torch_weights(model: Any, weights: Path, key: Optional[str]) -> None:
    """Load `weights` strictly into the torch `model` (the prefix, if any, chosen as convert chooses it)."""
    torch = import_torch()

    from trainkit.bridge.convert import choose_prefix

    state = read_state_dict(weights, key)
    own = model.state_dict()
    prefix = choose_prefix(list(state.tensors), list(own), (), None)
    tensors = collections.OrderedDict((name[len(prefix):], torch.from_numpy(np.ascontiguousarray(value)))
                                      for name, value in state.tensors.items() if name.startswith(prefix))
    # the modules' state versions, which a file read as plain arrays lost (torchvision's MNASNet refuses none)
    tensors._metadata = getattr(own, "_metadata", None)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        raise CheckpointError(f"--torch-weights {weights} does not load into the PyTorch model: "
                              f"{' '.join(str(error).split())[:600]}") from error


def torch_names(model: Any, network: nn.Cell, rules: Sequence[Rule]) -> Dict[str, str]:
    """torch module name -> network cell name, through the weights' name mapping."""
    parameters = map_names(list(model.state_dict()), [p.name for p in network.get_parameters()], rules).targets
    names = {}
    for name, _ in model.named_modules():
        mapped = module_name(name, parameters, rules) if name else NETWORK
        if mapped is not None:
            names[name or NETWORK] = mapped
    return names


def compare_layers(network: nn.Cell, model: Any, batch: np.ndarray, rules: Sequence[Rule] = ()) -> List[LayerRow]:
    """Every layer of `network` next to its PyTorch counterpart in `model` (paired by mapped name) on `batch`."""
    outputs = network_outputs(network, batch)
    names = torch_names(model, network, rules)
    reference, reference_names = {}, {}
    for key, value in torch_outputs(model, batch).items():
        base, hash_, count = key.partition("#")
        mapped = names.get(base)
        if mapped is not None:
            reference[mapped + hash_ + count] = value
            reference_names[mapped + hash_ + count] = key
    return layer_table(outputs, reference, reference_names)


def unpaired_layers(network: nn.Cell, model: Any, rules: Sequence[Rule] = ()) -> Tuple[List[str], List[str]]:
    """The layers with parameters of their own left without a counterpart: (in the network, in the torch model).

    A layer left unpaired is not compared at all, so "agree" would say nothing about it.
    """
    names = torch_names(model, network, rules)
    cells = {name for name, cell in network.cells_and_names() if name and list(cell.get_parameters(expand=False))}
    paired = {mapped for torch_name, mapped in names.items() if torch_name != NETWORK}
    torch_side = [name for name, module in model.named_modules()
                  if name and list(module.parameters(recurse=False)) and names.get(name) not in cells]
    return sorted(cells - paired), torch_side


def print_table(rows: Sequence[LayerRow], stream=None) -> None:
    stream = sys.stdout if stream is None else stream
    with_diff = any(row.max_abs_diff is not None for row in rows)
    width = max([len(row.name) for row in rows] + [5])
    header = f"{'layer':<{width}}  {'shape':<14} {'dtype':<8} {'mean':>10} {'std':>10} {'min':>10} {'max':>10} " \
             f"{'nonfin':>6}" + (f" {'max_abs':>10} {'max_rel':>10}" if with_diff else "")
    print(header, file=stream)
    for row in rows:
        line = f"{row.name:<{width}}  {row.shape:<14} {row.dtype:<8} {row.mean:>10.4g} {row.std:>10.4g} " \
               f"{row.min:>10.4g} {row.max:>10.4g} {row.nonfinite:>6}"
        if with_diff:
            line += (f" {row.max_abs_diff:>10.3g} {row.max_rel_diff:>10.3g}" if row.max_abs_diff is not None
                     else f" {'-':>10} {'-':>10}")
        print(line, file=stream)


def write_table(rows: Sequence[LayerRow], csv_path: Optional[Path], json_path: Optional[Path],
                summary: Dict[str, Any]) -> None:
    records = [asdict(row) for row in rows]
    if csv_path:
        with written_whole(csv_path) as temporary, open(temporary, "w", newline="", encoding="utf-8") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(records[0]) if records else ["name"])
            writer.writeheader()
            writer.writerows(records)
    if json_path:
        write_text_whole(json_path, json.dumps({**summary, "layers": records}, indent=1, allow_nan=True))


def fixed_batch(shape: Sequence[int], seed: int) -> np.ndarray:
    """The batch both sides see: uniform in [-1, 1], float32, as the seed's unit test draws it."""
    return np.random.default_rng(seed).uniform(-1, 1, tuple(shape)).astype(np.float32)


def _input_shape(cfg, data, batch_size: int, given: Optional[str]) -> List[int]:
    if given:
        try:
            return [batch_size, *(int(part) for part in given.split(","))]
        except ValueError as error:
            raise ConfigError(f"--input-shape {given!r} is not valid: give the sample's shape, e.g. 3,32,32") from error
    size = cfg.data.get("image_size")
    channels = cfg.model.get("in_channels") or getattr(data, "image_channels", None)
    if size is None or channels is None:
        raise ConfigError("the input shape cannot be told from the config (no data.image_size or image channels): "
                          "give --input-shape, e.g. --input-shape 4 for 4 features or 3,32,32 for an image")
    return [batch_size, int(channels), int(size), int(size)]


def _arguments(arguments: Dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in arguments.items())


def parse_arguments(items: Sequence[str], option: str = "--torch-arg") -> Dict[str, Any]:
    arguments = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key.isidentifier():
            raise ConfigError(f"{option} {item!r} is not valid: give NAME=VALUE, e.g. num_classes=10")
        arguments[key] = yaml.safe_load(value)
    return arguments


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.compare WEIGHTS [OVERRIDES...] [--torch-model M:F ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.compare",
        description="Run one fixed batch through the network in eval mode and print every layer's output "
                    "statistics; with --torch-model, compare each layer with PyTorch's and name the first that "
                    "differs. Exit 0: agree, 1: differ, 2: bad input.")
    parser.add_argument("weights", help="a MindSpore checkpoint (converted, exported, training) or PyTorch weights "
                                        "(.pth/.safetensors, converted in memory)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides building the network, or run=RUN_DIR")
    parser.add_argument("--weights-of", choices=("live", "ema"), default="live", dest="which",
                        help="a training checkpoint's live (default) or EMA weights")
    parser.add_argument("--mapping", type=Path, help="the mapping file for PyTorch names (as in trainkit.convert)")
    parser.add_argument("--key", help="the entry of a wrapping PyTorch checkpoint that holds the state dict")
    parser.add_argument("--prefix", help="the prefix of the PyTorch names to use, stripped (as in trainkit.convert)")
    parser.add_argument("--torch-model", help="the PyTorch model as MODULE:FACTORY, e.g. mypkg.models:resnet50")
    parser.add_argument("--torch-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="an argument of the factory (repeat), e.g. num_classes=10")
    parser.add_argument("--torch-weights", type=Path, help="the PyTorch model's weights (default: WEIGHTS when it "
                                                           "is a PyTorch file)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--input-shape", help="one sample's shape (default: in_channels,image_size,image_size)")
    parser.add_argument("--input", type=Path, help="a .npy batch to use instead of the random one (integers stay "
                                                   "integers: token ids)")
    parser.add_argument("--input-ints", type=int, metavar="N", help="the random batch is token ids in [0, N) "
                                                                  "(give --input-shape, e.g. 12 for 12 tokens)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batch")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"largest relative difference per layer (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--allow-unpaired", action="store_true",
                        help="exit 0 although layers with parameters are left unpaired (not compared)")
    parser.add_argument("--csv", type=Path, help="write the table as CSV")
    parser.add_argument("--json", type=Path, help="write the table and the verdict as JSON")
    add_trust_argument(parser, "with run=RUN_DIR: ")
    args = parser.parse_intermixed_args(argv)
    try:
        return _run(args)
    except (ConfigError, DataError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2


def _batch(args: argparse.Namespace, cfg, data) -> np.ndarray:
    """The batch both sides see: ``--input`` (integers kept as int64, token ids; anything else float32), token ids
    with ``--input-ints``, else :func:`fixed_batch`."""
    if args.input_ints is not None and args.input_ints <= 0:
        raise ConfigError(f"--input-ints {args.input_ints} is not valid: give the vocabulary size, a positive number")
    if args.input:
        try:
            with open_input(args.input, name=f"--input {args.input}") as stream:  # DataError unless a regular file
                batch = np.load(stream)
        except DataError:
            raise
        except (OSError, ValueError) as error:
            raise DataError(f"--input {args.input} cannot be read as a .npy array: {error}") from error
        if not (np.issubdtype(batch.dtype, np.integer) or np.issubdtype(batch.dtype, np.floating)):
            raise DataError(f"--input {args.input} holds {batch.dtype} values: give numbers (floats, or integer "
                            "token ids)")
        return batch.astype(np.int64) if np.issubdtype(batch.dtype, np.integer) else batch.astype(np.float32)
    if args.input_ints is not None:
        if not args.input_shape:
            raise ConfigError("--input-ints needs --input-shape, one sample's shape: e.g. --input-shape 12 for 12 "
                              "tokens")
        shape = _input_shape(cfg, data, args.batch_size, args.input_shape)
        return np.random.default_rng(args.seed).integers(0, args.input_ints, shape)
    return fixed_batch(_input_shape(cfg, data, args.batch_size, args.input_shape), args.seed)


def _run(args: argparse.Namespace) -> int:
    weights = Path(args.weights)
    rules = load_rules(args.mapping) if args.mapping else []
    model = None  # the PyTorch side, checked before anything runs
    if args.torch_model:
        torch_weights = args.torch_weights or (weights if weights.suffix not in MINDSPORE_SUFFIXES else None)
        if torch_weights is None:
            raise ConfigError("--torch-model needs the PyTorch weights: --torch-weights PATH (WEIGHTS is a MindSpore "
                              "checkpoint)")
        model = import_model(args.torch_model, parse_arguments(args.torch_arg))
        load_torch_weights(model, torch_weights, args.key)
    cfg = tool_config(args.overrides, args.trust)
    level = OmegaConf.select(cfg, "amp.level", default="O0")
    level = getattr(level, "name", str(level))  # an AmpLevel in the app's schema
    if level != "O0":
        raise ConfigError(f"amp={level}: compare runs both networks in float32 and would not test {level}'s float16 "
                          "layers; add amp.level=O0 (amp=O0 with a recipe) to compare the weights, and run "
                          f"python -m trainkit.evaluate with amp={level} to see its accuracy")
    set_device(cfg)
    data, network = build_prepared(cfg)
    if weights.suffix in MINDSPORE_SUFFIXES:
        load_weights(network, network_weights(weights, args.which), str(weights))
    else:
        conversion = convert_state_dict(read_state_dict(weights, args.key), network, rules, (), args.prefix,
                                        describe_network(cfg, data))
        if not conversion.complete:
            print("\n".join(conversion.report()))
            raise CheckpointError(f"{weights} does not convert into the network (see the report above)")
        load_weights(network, conversion.values, str(weights))
    batch = _batch(args, cfg, data)
    reference = model
    rows = compare_layers(network, model, batch, rules) if model is not None else \
        layer_table(network_outputs(network, batch))
    print_table(rows)
    diverged = first_divergence(rows, args.tolerance) if reference is not None else None
    nonfinite = [row.name for row in rows if row.nonfinite]
    summary: Dict[str, Any] = {"weights": str(weights), "batch_shape": list(batch.shape), "tolerance": args.tolerance,
                               "first_divergence": diverged.name if diverged else None}
    unpaired = False
    if reference is not None:
        paired = sum(row.max_abs_diff is not None for row in rows)
        here, there = unpaired_layers(network, model, rules)
        summary.update(paired_layers=paired, unpaired_here=here, unpaired_in_torch=there)
        left = f"unpaired layers with parameters: {len(here)} here" + (f" ({listing(here, 3)})" if here else "") + \
            f", {len(there)} in PyTorch" + (f" ({listing(there, 3)})" if there else "")
        print(left)
        unpaired = bool(here or there) and not args.allow_unpaired
        if unpaired:
            print("layers left unpaired are not compared: their names differ (give the mapping file with --mapping) "
                  "or one side lacks them; --allow-unpaired accepts that")
        if diverged is not None:
            how = (f"output shape {diverged.shape} here, {diverged.torch_shape} in PyTorch"
                   if diverged.shape != diverged.torch_shape else
                   f"max abs diff {diverged.max_abs_diff:.3g}, relative {diverged.max_rel_diff:.3g}")
            print(f"first layer beyond the tolerance ({args.tolerance:g} relative): {diverged.name} (torch "
                  f"{diverged.torch_name}): {how}")
        else:
            final = next((row for row in rows if row.name == NETWORK), None)
            print(f"{'agree' if not unpaired else 'paired layers agree'}: {paired} layers paired with PyTorch, "
                  f"every one within {args.tolerance:g} relative"
                  + (f" (output: max abs diff {final.max_abs_diff:.3g})" if final and final.max_abs_diff is not None
                     else ""))
    elif nonfinite:
        print(f"non-finite values first in {nonfinite[0]}")
    write_table(rows, args.csv, args.json, summary)
    failed = diverged is not None or unpaired or (reference is None and bool(nonfinite))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
