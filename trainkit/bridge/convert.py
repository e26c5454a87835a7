"""``python -m trainkit.convert SRC DST [OVERRIDES...]``: PyTorch weights into a MindSpore checkpoint of a network.

The network is built from the overrides exactly as ``python -m trainkit OVERRIDES`` would build it (or from a
run's saved config with ``run=RUN_DIR``), so the checkpoint loads strictly into the run's model::

    python -m trainkit.convert resnet50.pth resnet50.ckpt recipe=resnet50_cifar10 model.num_classes=10

Every name and shape is checked on both sides; the report lists what matched, what is only in the source,
only in the network, or shaped differently. When the network would lack anything, nothing is written, unless
``--allow-missing PATTERN`` names it: those parameters keep the network's initialisation (a head for another
number of classes). float16/bfloat16 sources become the network's float32, and the report says so.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import nn

from trainkit.app.tool_config import build_data, build_network, describe_network, set_device, tool_config
from trainkit.bridge.name_mapping import NameMapping, Rule, load_rules, map_names
from trainkit.bridge.state_dict import StateDict, read_state_dict
from trainkit.errors import CheckpointError, ConfigError, DataError
from trainkit.rundir.parameter_fit import listing
from trainkit.rundir.trust import add_trust_argument
from trainkit.rundir.weights import matching, numpy_dtype, refuse_existing, write_checkpoint

log = logging.getLogger("trainkit")


@dataclass
class Conversion:
    """A source state dict laid onto a network: the values to write and what did not fit."""

    source: StateDict
    network: str  # what the network is, for the report
    prefix: str
    mapping: NameMapping
    values: Dict[str, np.ndarray]  # network name -> value in the network's dtype (initialisation where kept)
    matched: List[str] = field(default_factory=list)
    only_in_source: List[str] = field(default_factory=list)
    only_in_target: List[str] = field(default_factory=list)
    wrong_shape: List[str] = field(default_factory=list)
    wrong_shape_allowed: List[str] = field(default_factory=list)  # shaped differently, kept by --allow-missing
    kept_initialised: List[str] = field(default_factory=list)
    cast: Dict[str, int] = field(default_factory=dict)  # "float16 -> float32" -> count

    @property
    def complete(self) -> bool:
        """Whether every parameter of the network got a value (its own initialisation where allowed)."""
        return not self.only_in_target and not self.wrong_shape

    def report(self) -> List[str]:
        """The lines printed by the command."""
        source = self.source
        where = f"entry {source.entry!r}" if source.entry else "top level"
        lines = [f"network: {self.network}",
                 f"source: {source.path}: {len(source.tensors)} tensors ({where}"
                 + (f", prefix {self.prefix!r} stripped" if self.prefix else "")
                 + (f"; not tensors, ignored: {listing(source.ignored)}" if source.ignored else "") + ")",
                 f"matched: {len(self.matched)} parameters of the network"
                 + (f" ({self.mapping.renamed_batch_norm} batch-norm names renamed: weight/bias/running_mean/"
                    "running_var -> gamma/beta/moving_mean/moving_variance)" if self.mapping.renamed_batch_norm
                    else "")]
        reasons = Counter(self.mapping.dropped.values())
        for reason, count in reasons.items():
            lines.append(f"dropped: {count} ({reason})")
        lines.append(f"only in the source: {len(self.only_in_source)}"
                     + (f": {listing(self.only_in_source)}" if self.only_in_source else ""))
        lines.append(f"only in the network: {len(self.only_in_target)}"
                     + (f": {listing(self.only_in_target)}" if self.only_in_target else ""))
        shaped = self.wrong_shape + self.wrong_shape_allowed
        lines.append(f"wrong shape: {len(shaped)}" + (f": {listing(shaped, 4)}" if shaped else "")
                     + (f" ({len(self.wrong_shape_allowed)} allowed by --allow-missing)"
                        if self.wrong_shape_allowed else ""))
        if self.kept_initialised:
            lines.append(f"kept the network's initialisation (--allow-missing): {listing(self.kept_initialised)}")
        for cast, count in self.cast.items():
            lines.append(f"dtype: {count} tensors {cast}")
        return lines


def convert_state_dict(source: StateDict, network: nn.Cell, rules: Sequence[Rule] = (),
                       allow_missing: Sequence[str] = (), prefix: Optional[str] = None,
                       description: str = "") -> Conversion:
    """Lay `source` onto `network`'s parameters by name (nothing is loaded or written).

    Args:
        source: from :func:`trainkit.bridge.state_dict.read_state_dict`.
        network: the target network, freshly built.
        rules: a mapping file's rules (:func:`trainkit.bridge.name_mapping.load_rules`), applied before batch norm's.
        allow_missing: shell-style patterns of network parameters that may be missing or shaped differently in
            the source; they keep the network's initialisation.
        prefix: take only source names starting with it, stripped (``module.``, ``model.``); None picks the
            prefix (none, or a leading component shared by names) under which most names match the network.
        description: what the network is, for the report.

    Raises:
        ConfigError: `prefix` matches no name, several prefixes fit equally, or two names map onto one.
    """
    own = {p.name: p for p in network.get_parameters()}
    prefix = choose_prefix(list(source.tensors), list(own), rules, prefix)
    stripped = {name[len(prefix):]: name for name in source.tensors if name.startswith(prefix)}
    mapping = map_names(list(stripped), list(own), rules)
    conversion = Conversion(source, description or type(network).__name__, prefix, mapping, values={})
    by_target = {target: stripped[name] for name, target in mapping.targets.items()}
    allowed = set(matching(own, allow_missing))
    casts: Counter = Counter()
    for name, parameter in own.items():
        dtype = numpy_dtype(parameter.dtype)
        original = by_target.get(name)
        if original is None:
            if name in allowed:
                conversion.kept_initialised.append(name)
            else:
                conversion.only_in_target.append(name)
            conversion.values[name] = parameter.asnumpy()
            continue
        value = source.tensors[original]
        if tuple(value.shape) != tuple(parameter.shape):
            shapes = f"{original} {tuple(value.shape)} -> {name} {tuple(parameter.shape)}"
            if name in allowed:
                conversion.kept_initialised.append(name)
                conversion.wrong_shape_allowed.append(shapes)
            else:
                conversion.wrong_shape.append(shapes)
            conversion.values[name] = parameter.asnumpy()
            continue
        if source.source_dtypes.get(original, str(value.dtype)) != np.dtype(dtype).name:
            casts[f"{source.source_dtypes.get(original, value.dtype)} -> {np.dtype(dtype).name}"] += 1
        conversion.values[name] = value.astype(dtype)
        conversion.matched.append(name)
    conversion.only_in_source = [stripped[name] for name, target in mapping.targets.items() if target not in own]
    conversion.cast = dict(casts)
    check_values(conversion, by_target)
    return conversion


def check_values(conversion: Conversion, sources: Dict[str, str]) -> None:
    """Refuse values no trained network holds: non-finite ones, and a batch norm's negative variance (its running
    mean and variance swapped by a mapping, say), naming the tensor on both sides.

    Raises:
        CheckpointError: the first such tensor.
    """
    path = conversion.source.path
    for name in conversion.matched:
        value, original = conversion.values[name], sources[name]
        if not np.issubdtype(value.dtype, np.floating):
            continue
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        if bad:
            raise CheckpointError(f"{path}: {original} (-> {name}) holds {bad} non-finite values (NaN or inf) of "
                                  f"{value.size}: refused; these weights cannot have come from a working model")
        if name.endswith("moving_variance") and value.size and float(value.min()) < 0:
            negative = int(np.count_nonzero(value < 0))
            raise CheckpointError(f"{path}: {original} (-> {name}) is a batch norm's variance but holds {negative} "
                                  f"negative values (smallest {float(value.min()):.4g}): refused; a mapping rule may "
                                  "have swapped running_mean and running_var")


def convert(source: Path, output: Path, overrides: Sequence[str] = (), mapping_file: Optional[Path] = None,
            allow_missing: Sequence[str] = (), key: Optional[str] = None, prefix: Optional[str] = None,
            force: bool = False, trust: Sequence[str] = ()) -> Conversion:
    """Convert `source` for the network `overrides` build and write it to `output` when it is complete (`trust`:
    the modules a ``run=RUN_DIR`` config may name targets of, besides trainkit's own).

    Raises:
        CheckpointError: the source is unreadable, `output` exists (without `force`), or the network would lack
            parameters (nothing is written; the returned report is attached as ``error.conversion``).
        ConfigError: the overrides or the mapping file are invalid.
    """
    refuse_existing(output, force)
    rules = load_rules(mapping_file) if mapping_file else []
    state = read_state_dict(source, key)
    cfg = tool_config(overrides, trust)
    set_device(cfg)
    data, network = build_prepared(cfg)
    conversion = convert_state_dict(state, network, rules, allow_missing, prefix, describe_network(cfg, data))
    if not conversion.complete:
        problems = []
        if conversion.only_in_target:
            problems.append(f"{_count(conversion.only_in_target, 'parameter')} of the network not in the source "
                            f"({listing(conversion.only_in_target, 3)})")
        if conversion.wrong_shape:
            problems.append(f"{_count(conversion.wrong_shape, 'parameter')} shaped differently "
                            f"({listing(conversion.wrong_shape, 2)})")
        error = CheckpointError(f"nothing was written to {output}: {' and '.join(problems)}; a mapping file "
                                "(--mapping) renames source names, --allow-missing PATTERN keeps the network's "
                                "initialisation for a head of another shape")
        error.conversion = conversion  # type: ignore[attr-defined]
        raise error
    write_checkpoint([{"name": name, "data": ms.Tensor(value)} for name, value in conversion.values.items()], output)
    return conversion


def build_prepared(cfg):
    """(data module, network) as the app builds them: the data module prepared first (it may set num_classes).

    Data that is not on this machine (a CIFAR-10 not downloaded) does not stop a network that does not need it:
    the data module's attributes then come from its class, and only a key they leave null stops, naming both.
    """
    data = build_data(cfg)
    try:
        data.prepare()
    except DataError as error:
        try:
            return data, build_network(cfg, data)
        except ConfigError as build_error:
            raise ConfigError(f"{build_error} (the data module's prepare() would fill it, but failed: {error})"
                              ) from error
    return data, build_network(cfg, data)


def _count(items: Sequence, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def choose_prefix(names: List[str], targets: List[str], rules: Sequence[Rule], prefix: Optional[str]) -> str:
    """`prefix` when given (checked), else the prefix (none, or a leading component or two) under which most names
    map onto `targets`; ConfigError when several fit equally."""
    if prefix is not None:
        if not any(name.startswith(prefix) for name in names):
            raise ConfigError(f"--prefix {prefix!r}: no source name starts with it (they look like "
                              f"{listing(names, 3)})")
        return prefix
    candidates = {""}
    for name in names:
        parts = name.split(".")
        candidates.update(".".join(parts[:depth]) + "." for depth in (1, 2) if len(parts) > depth)
    wanted = set(targets)

    def score(candidate: str) -> int:
        stripped = [name[len(candidate):] for name in names if name.startswith(candidate)]
        return sum(target in wanted for target in map_names(stripped, targets, rules).targets.values())

    scores = {candidate: score(candidate) for candidate in sorted(candidates)}
    best = max(scores.values())
    winners = [candidate for candidate, value in scores.items() if value == best]
    if best == 0 or "" in winners:
        return ""
    if len(winners) > 1:
        raise ConfigError(f"the source holds several models: under each of the prefixes {', '.join(winners)} "
                          f"{best} names fit the network; choose one with --prefix")
    return winners[0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.convert SRC DST [OVERRIDES...] [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.convert",
        description="Convert PyTorch weights (.safetensors, or .pth/.pt/.bin with the torch extra) into a MindSpore "
                    "checkpoint of the network the overrides build, as python -m trainkit would build it.")
    parser.add_argument("source", help="the PyTorch weights: .safetensors, .pth, .pt, .bin")
    parser.add_argument("output", help="the MindSpore checkpoint to write (.ckpt)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (model=resnet50 model.num_classes=10), or "
                                                     "run=RUN_DIR for a run's saved config")
    parser.add_argument("--mapping", type=Path, help="YAML rules renaming source names: a list of "
                                                     "{pattern: REGEX, replace: TEXT or null}, applied in order")
    parser.add_argument("--allow-missing", action="append", default=[], metavar="PATTERN",
                        help="network parameters (shell pattern, e.g. 'fc.*') that may be missing or shaped "
                             "differently in the source: they keep the network's initialisation")
    parser.add_argument("--key", help="the entry of a wrapping checkpoint that holds the state dict (default: "
                                      "state_dict, model_state_dict, model, ... when the top level is not one)")
    parser.add_argument("--prefix", help="use only names starting with PREFIX, stripped (module., model.); "
                                         "default: the prefix, if any, under which most names fit the network")
    parser.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    add_trust_argument(parser, "with run=RUN_DIR: ")
    args = parser.parse_intermixed_args(argv)
    try:
        conversion = convert(Path(args.source), Path(args.output), args.overrides, args.mapping, args.allow_missing,
                             args.key, args.prefix, args.force, args.trust)
    except (ConfigError, DataError) as error:
        report = getattr(error, "conversion", None)
        if report is not None:
            print("\n".join(report.report()))
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(conversion.report()))
    print(f"wrote {args.output}: {len(conversion.values)} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
