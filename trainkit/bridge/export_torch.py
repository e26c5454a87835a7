"""``python -m trainkit.export CKPT OUT.pth --to torch``: a network's weights back to PyTorch, under PyTorch's names.

The way back of ``convert``: the network's parameters (live or EMA, from a training, exported or converted
checkpoint) are renamed as PyTorch names them -- batch norm's and layer norm's ``gamma/beta/moving_mean/
moving_variance`` become ``weight/bias/running_mean/running_var``, each batch norm gets the
``num_batches_tracked`` counter ``load_state_dict`` expects (0: MindSpore does not count; it matters only to a
PyTorch batch norm with ``momentum=None``), and a mapping file's rules are applied in reverse -- and written as
``.safetensors`` (no PyTorch needed) or ``.pth``/``.pt``: a plain ``state_dict`` of tensors that
``torch.load(path, weights_only=True)`` reads. The call counters of trainkit's Dropout layers (the position of
their random streams) have no PyTorch counterpart and are left out.

A Parameter two modules share (a language model's head and its token embedding: ``lm_head.weight`` is
``transformer.wte.weight``) is kept once by a MindSpore checkpoint, and listed under each of its names by PyTorch's
``state_dict``: ``port`` records the second names in the model config (``model.tied_weights``), a run stores that
config in its checkpoints, and the export writes the Parameter under every name, so that ``load_state_dict(...,
strict=True)`` takes the file.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from trainkit.app.finetune import TIED_WEIGHTS
from trainkit.bridge.name_mapping import BATCH_NORM_COUNTER, BATCH_NORM_NAMES, Rule, apply_rules, load_rules
from trainkit.bridge.torch_import import import_torch
from trainkit.errors import CheckpointError, ConfigError, DataError
from trainkit.rundir.checkpoint_file import find_checkpoint, stored_config
from trainkit.rundir.output_file import written_whole
from trainkit.rundir.stored_config import read_stored_config
from trainkit.rundir.trust import WEIGHTS_ONLY, add_trust_argument
from trainkit.rundir.weights import PYTORCH_SUFFIXES, WEIGHTS, network_weights, refuse_existing

TORCH_SUFFIXES = (".safetensors", ".pth", ".pt")
_TORCH_NAMES = {value: key for key, value in BATCH_NORM_NAMES.items()}  # gamma -> weight, ...
# A regular expression that matches one literal text: escapes and anchors only.
_SPECIAL = set(".^$*+?{}[]\\|()")


def torch_names(names: Sequence[str], rules: Sequence[Rule] = ()) -> Dict[str, str]:
    """network name -> PyTorch name: norm names back, then the mapping file's rules in reverse.

    Raises:
        ConfigError: a rule that cannot be reversed (a pattern that is not literal text, a replacement with group
            references), or one whose reverse does not lead back to the network's name.
    """
    reverse = [_reversed(index, rule) for index, rule in enumerate(rules) if rule.replace is not None][::-1]
    mapped = {}
    for name in names:
        module, _, leaf = name.rpartition(".")
        torch_name = f"{module}.{_TORCH_NAMES[leaf]}" if module and leaf in _TORCH_NAMES else name
        for pattern, replace in reverse:
            torch_name = pattern.sub(replace, torch_name)
        forward = apply_rules(torch_name, rules)
        if rules and forward is not None and forward.rpartition(".")[0] != name.rpartition(".")[0]:
            raise ConfigError(f"the mapping's rules in reverse send {name} to {torch_name}, which they do not send "
                              f"back to {name} (but to {forward}): write the reverse rules as a mapping file of its "
                              "own for this export")
        mapped[name] = torch_name
    return mapped


def _literal(pattern: str) -> Optional[str]:
    """The text a pattern matches when it is literal (escapes allowed, ``^``/``$`` anchors aside), else None."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    text, index = "", 0
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body) and not body[index + 1].isalnum():
            text += body[index + 1]
            index += 2
            continue
        if char in _SPECIAL:
            return None
        text += char
        index += 1
    return text


def _reversed(index: int, rule: Rule):
    text = _literal(rule.pattern.pattern)
    if text is None or "\\" in (rule.replace or ""):
        raise ConfigError(f"mapping rule {index} ({rule.pattern.pattern!r} -> {rule.replace!r}) cannot be applied in "
                          "reverse: only literal texts can (e.g. '^encoder\\.' -> 'body.'); write the reverse rules "
                          "as a mapping file of their own for this export")
    start = "^" if rule.pattern.pattern.startswith("^") else ""
    end = "$" if rule.pattern.pattern.endswith("$") and not rule.pattern.pattern.endswith("\\$") else ""
    return re.compile(start + re.escape(rule.replace) + end), text.replace("\\", "\\\\")


def dropout_counter(name: str, value: np.ndarray) -> bool:
    """Whether `name` is the call counter of trainkit's Dropout (``<layer>.calls``, an int32 scalar): the position
    of its random stream, which PyTorch's Dropout has no place for."""
    return (name == "calls" or name.endswith(".calls")) and np.shape(value) == () and \
        np.asarray(value).dtype == np.int32


def tied_weights(checkpoint: Path) -> Tuple[List[Tuple[str, str]], Optional[str]]:
    """(PyTorch's second name, the name the checkpoint keeps) of each Parameter the network shares, and where they
    were read: ``model.tied_weights`` of the run's config `checkpoint` stores (a training checkpoint, best.ckpt),
    else of the model config port wrote beside it (``DIR/weights.ckpt`` with ``DIR/conf/model/DIR.yaml``, or a
    project's ``conf/model/DIR.yaml``); none without either.

    Raises:
        ConfigError: the record is not a list of pairs of names.
    """
    if checkpoint.suffix in PYTORCH_SUFFIXES:  # not a MindSpore checkpoint: reading its weights says so
        return [], None
    config = stored_config(checkpoint)
    if config is not None:
        model = config.get("model")
        source = f"the config stored in {checkpoint}"
    else:
        found = ported_config(checkpoint)
        if found is None:
            return [], None
        model, source = read_stored_config(found, f"model config {found}"), str(found)
    value = model.get(TIED_WEIGHTS) if isinstance(model, DictConfig) else None
    return tie_pairs(value, source), (source if value else None)


def ported_config(checkpoint: Path) -> Optional[Path]:
    """The model config port wrote for the package `checkpoint` lies in: in the package (``DIR/conf/model/DIR.yaml``)
    or, ported ``--into`` a project, in the project's package (``NAME/conf/model/DIR.yaml`` beside ``NAME/DIR``)."""
    folder = checkpoint.resolve().parent
    for home in (folder, folder.parent):
        path = home / "conf" / "model" / f"{folder.name}.yaml"
        if path.is_file():
            return path
    return None


def tie_pairs(value, source: str) -> List[Tuple[str, str]]:
    """``model.tied_weights`` (read from `source`) as (alias, name) pairs; ConfigError naming it when it is not a list
    of pairs of names."""
    if value is None:
        return []
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if not isinstance(value, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(name, str) and name for name in pair)
            for pair in value):
        raise ConfigError(f"model.{TIED_WEIGHTS} in {source} is not valid: give a list of [PyTorch's second name, "
                          "the name the checkpoint keeps] pairs, e.g. [[lm_head.weight, transformer.wte.weight]]")
    return [(alias, name) for alias, name in value]


def torch_state(values: Dict[str, np.ndarray], rules: Sequence[Rule] = (),
                tied: Sequence[Tuple[str, str]] = ()) -> Dict[str, np.ndarray]:
    """The network's `values` as a PyTorch state dict (names back, batch norm's counters added, trainkit
    Dropout's call counters left out, each tied Parameter under its second names too: `tied` (alias, name) in
    PyTorch's names; an alias the network holds a Parameter of its own for keeps that one)."""
    values = {name: value for name, value in values.items() if not dropout_counter(name, value)}
    names = torch_names(list(values), rules)
    state: Dict[str, np.ndarray] = {}
    for name, value in values.items():
        state[names[name]] = value
        if name.endswith(".moving_mean"):
            counter = f"{names[name].rpartition('.')[0]}.{BATCH_NORM_COUNTER}"
            state[counter] = np.zeros((), dtype=np.int64)
    clashes = len(state) - len(set(state))
    if clashes:
        raise ConfigError("the reversed mapping sends two parameters to one PyTorch name")
    for alias, name in tied:
        if alias in state:
            continue
        if name not in state:
            raise ConfigError(f"model.{TIED_WEIGHTS} ties {alias} to {name}, which the checkpoint does not hold under "
                              f"PyTorch's names (it holds {_some(state)}): the record is not this network's")
        state[alias] = state[name]  # one array: written once as one tensor shared by both names
    return state


def _some(names, count: int = 3) -> str:
    listed = list(names)
    return ", ".join(listed[:count]) + (f" and {len(listed) - count} more" if len(listed) > count else "")


def os_error_of(error: BaseException) -> Optional[OSError]:
    """The OSError inside a Rust library's I/O error message (``I/O error: ... (os error 28)``), or None."""
    found = re.search(r"I/O error: .*\(os error (\d+)\)", str(error))
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else None


def write_torch(state: Dict[str, np.ndarray], output: Path) -> Path:
    """`state` as ``.safetensors`` or a ``torch.save`` state dict, through a temporary file renamed into place."""
    with written_whole(output, output.suffix) as temporary:
        if output.suffix == ".safetensors":
            from safetensors.numpy import save_file

            try:
                save_file({name: np.array(value, order="C") for name, value in state.items()}, str(temporary))
            except Exception as error:  # safetensors' own error class, for an I/O error too: said as the OSError
                underlying = os_error_of(error)
                if underlying is None:
                    raise
                raise underlying from error
        else:
            try:
                torch = import_torch()
            except ImportError as error:
                raise ConfigError(f"{output}: writing a .pth needs PyTorch: pip install 'trainkit[torch]', or write "
                                  ".safetensors, which needs none") from error
            tensors: Dict[int, object] = {}  # a tied Parameter's one array: one tensor under both names, as PyTorch
            torch.save({name: tensors.setdefault(id(value), torch.from_numpy(np.array(value)))
                        for name, value in state.items()}, str(temporary))
    return output


def export_torch(checkpoint: Path, output: Path, mapping: Optional[Path] = None, weights: str = "live",
                 force: bool = False, tied: Optional[Sequence[Tuple[str, str]]] = None) -> Dict[str, np.ndarray]:
    """Write the network's weights in `checkpoint` to `output` as a PyTorch state dict; returns what was written.
    `tied`: the second names of shared Parameters (None: :func:`tied_weights` of the checkpoint)."""
    if output.suffix not in TORCH_SUFFIXES:
        raise ConfigError(f"{output}: --to torch writes {', '.join(TORCH_SUFFIXES)} files; a .ckpt is MindSpore's "
                          "(leave out --to torch for it)")
    refuse_existing(output, force)
    rules: List[Rule] = load_rules(mapping) if mapping else []
    if tied is None:
        tied = tied_weights(checkpoint)[0]
    state = torch_state(network_weights(checkpoint, weights), rules, tied)
    write_torch(state, output)
    return state


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.export CHECKPOINT OUTPUT --to torch [--mapping FILE] [--weights-of W]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.export",
        description="Write a network's weights (from a training, exported or converted checkpoint) as a PyTorch "
                    "state dict under PyTorch's names: .safetensors, or .pth/.pt for torch.load(weights_only=True).")
    parser.add_argument("checkpoint", help="a trainkit checkpoint, e.g. outputs/<recipe>/<run>/checkpoints/best.ckpt, "
                                           "or a run directory (its best.ckpt, else its newest checkpoint)")
    parser.add_argument("output", help="the PyTorch file to write: .safetensors, .pth or .pt")
    parser.add_argument("--to", choices=("torch",), default="torch", help="torch (implied by the output's suffix)")
    parser.add_argument("--mapping", type=Path, help="the mapping file convert used: its rules are applied in "
                                                     "reverse (literal texts only)")
    parser.add_argument("--weights-of", "--weights", choices=WEIGHTS, default="live", dest="weights",
                        help="live: the trained weights (default); ema: the EMA shadow weights")
    parser.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    add_trust_argument(parser, WEIGHTS_ONLY)  # as the .onnx/.mindir forms take it
    args = parser.parse_args(argv)
    try:
        source = find_checkpoint(Path(args.checkpoint))  # a run directory: its best.ckpt (or its newest)
        tied, record = tied_weights(source)
        state = export_torch(source, Path(args.output), args.mapping, args.weights, args.force, tied)
    except (ConfigError, DataError, CheckpointError) as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    counters = sum(name.endswith(BATCH_NORM_COUNTER) for name in state)
    aliases = [(alias, name) for alias, name in tied if state.get(alias) is state.get(name)]
    print(f"wrote {args.output}: {len(state) - counters - len(aliases)} tensors of the network under PyTorch's names "
          f"({args.weights} weights, from {source})" + (f", and {counters} batch-norm num_batches_tracked counters (0)"
                                                        if counters else ""))
    if aliases:
        print(f"tied weights under each of their names, as PyTorch's state_dict lists them: "
              f"{', '.join(f'{alias} is {name}' for alias, name in aliases)} (model.{TIED_WEIGHTS} of {record})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
