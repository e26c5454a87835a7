"""``python -m trainkit.export``: an inference checkpoint of the network alone, from a training checkpoint.

A training checkpoint (``mindspore.save_checkpoint`` of the TrainingWrapper, as the app's epoch and best
checkpoints are) holds the network's parameters next to the training state: optimizer state
(``moment1.*``, ``moments.*``, ``beta1_power``, ``global_step``, ``learning_rate``, ...), the loss
scale (``loss_scale.*``), accumulation (``micro_step``, ``_grad_sum.*``), the non-finite guard
(``_window_start.*``, ``_loss_sum``) and the EMA (``ema.<name>``, ``ema_num_updates``). The export keeps
the network's parameters only, with the live values or the EMA's, so that ``mindspore.load_checkpoint``
+ ``load_param_into_net(model, ..., strict_load=True)`` fills the bare model and leaves nothing over::

    python -m trainkit.export outputs/run/checkpoints/best.ckpt model_ema.ckpt --weights ema
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

import mindspore as ms

from trainkit.errors import CheckpointError
from trainkit.rundir.checkpoint_file import find_checkpoint
from trainkit.rundir.trust import WEIGHTS_ONLY, add_trust_argument
from trainkit.rundir.weights import WEIGHTS, network_weights, refuse_existing, write_checkpoint


def export_checkpoint(checkpoint: Union[str, Path], output: Union[str, Path], weights: str = "live",
                      force: bool = False) -> Path:
    """Write the network's parameters from a training `checkpoint` to `output`.

    Args:
        checkpoint: a checkpoint of the TrainingWrapper (``mindspore.save_checkpoint(wrapper, ...)``).
        output: the inference checkpoint to write; written to a temporary file beside it and renamed
            into place, so it is never left half-written.
        weights: ``"live"`` (the trained weights) or ``"ema"`` (the EMA shadows ``ema.<name>``;
            parameters without a shadow, e.g. integer ones, keep their live value).
        force: replace an existing `output`.

    Returns:
        The path written.

    Raises:
        CheckpointError: `checkpoint` is missing, unreadable or holds no network parameters, `weights`
            is ``"ema"`` and it has no EMA, or `output` exists and `force` is False; each names the file.
        ValueError: `weights` is not ``"live"`` or ``"ema"``.
    """
    refuse_existing(output, force)
    values = network_weights(checkpoint, weights)
    return write_checkpoint([{"name": name, "data": ms.Tensor(value)} for name, value in values.items()], output)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m trainkit.export CHECKPOINT OUTPUT [--weights-of live|ema] [--force]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.export",
        description="Write an inference checkpoint of the network alone (no optimizer, EMA or wrapper state) "
                    "from a trainkit training checkpoint.")
    parser.add_argument("checkpoint", help="a training checkpoint, e.g. outputs/<recipe>/<run>/checkpoints/best.ckpt, "
                                           "or a run directory (its best.ckpt, else its newest checkpoint)")
    parser.add_argument("output", help="the inference checkpoint to write (.ckpt); an OUT.mindir or OUT.onnx output "
                                       "writes a model for serving instead (python -m trainkit.export CKPT "
                                       "model.onnx --help lists its options)")
    parser.add_argument("--weights-of", "--weights", choices=WEIGHTS, default="live", dest="weights",
                        help="live: the trained weights (default); ema: the EMA shadow weights")
    parser.add_argument("--to", choices=("mindspore", "torch"), default="mindspore",
                        help="mindspore: a .ckpt (default); torch: a PyTorch state dict (.safetensors, .pth, .pt) "
                             "under PyTorch's names, with --mapping FILE applied in reverse")
    parser.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    add_trust_argument(parser, WEIGHTS_ONLY)  # as the .onnx/.mindir forms take it
    args = parser.parse_args(argv)
    if args.to != "mindspore" or Path(args.output).suffix in (".safetensors", ".pth", ".pt"):
        print(f"trainkit: error: {args.output}: a MindSpore checkpoint is written as .ckpt; for PyTorch use "
              "python -m trainkit.export CHECKPOINT OUT.safetensors|OUT.pth --to torch", file=sys.stderr)
        return 2
    if Path(args.output).suffix != ".ckpt":  # a typo'd .onnx would write a checkpoint
        print(f"trainkit: error: {args.output}: the output's suffix names no format trainkit writes: .ckpt (an "
              "inference checkpoint), .mindir or .onnx (a model for serving), .safetensors, .pth or .pt (PyTorch "
              "weights); nothing was written", file=sys.stderr)
        return 2
    try:
        source = find_checkpoint(Path(args.checkpoint))  # a run directory: its best.ckpt (or its newest)
        path = export_checkpoint(source, args.output, weights=args.weights, force=args.force)
    except CheckpointError as error:
        print(f"trainkit: error: {error}", file=sys.stderr)
        return 2
    count = len(ms.load_checkpoint(str(path)))
    print(f"wrote {path}: {count} parameters of the network, {args.weights} weights, from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
