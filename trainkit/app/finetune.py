"""Fine-tuning: a new run that starts from a checkpoint's weights (``model.pretrained``), not a resume.

The network is built as usual, then every parameter is loaded strictly from the checkpoint -- converted
(``python -m trainkit.convert``), exported (``python -m trainkit.export``), or a training checkpoint's live or EMA
weights (``model.pretrained_weights``). Parameters named in ``model.pretrained_reinit`` (e.g. ``[fc.*]``) that the
checkpoint lacks or shapes differently keep the network's own initialisation (a head for another number of
classes); ``model.freeze`` patterns leave parameters out of the optimizer. The optimizer, the learning-rate
schedule, the data order and the EMA start fresh, and the run directory is a new run's: to continue a run, use
``trainer.resume``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from mindspore import nn
from mindspore.nn.layer.normalization import _BatchNorm
from omegaconf import DictConfig, OmegaConf

from trainkit.errors import CheckpointError, ConfigError
from trainkit.rundir.parameter_fit import listing
from trainkit.rundir.weights import WEIGHTS, load_weights, matching, network_weights

log = logging.getLogger("trainkit")

#: Keys of the model node that configure fine-tuning rather than the model's constructor.
FINETUNE_KEYS = ("pretrained", "pretrained_weights", "pretrained_reinit", "freeze", "freeze_batch_norm")
#: A key of the model node that records a fact about the model for the tools: the PyTorch names of each Parameter
#: two modules share (``[[lm_head.weight, transformer.wte.weight]]``: PyTorch's second name, then the one the
#: checkpoint keeps it under), written by ``port``, read by ``export --to torch`` from the run's stored config.
TIED_WEIGHTS = "tied_weights"
#: Keys of the model node that are not the model constructor's arguments.
NOT_ARGUMENTS = FINETUNE_KEYS + (TIED_WEIGHTS,)


def model_arguments(node: DictConfig) -> DictConfig:
    """The model node without the fine-tuning keys and the tied weights' record: what ``hydra.utils.instantiate``
    passes to the constructor."""
    if not any(key in node for key in NOT_ARGUMENTS):
        return node
    container = OmegaConf.to_container(node, resolve=True)
    for key in NOT_ARGUMENTS:
        container.pop(key, None)
    return OmegaConf.create(container)


def apply_finetuning(node: DictConfig, network: nn.Cell, resume: Optional[str] = None) -> None:
    """Load ``model.pretrained`` into the freshly built `network` and freeze ``model.freeze``; log what was done
    (`resume`: ``trainer.resume``, whose checkpoint, when there is one, replaces the pretrained weights).

    Raises:
        CheckpointError: the checkpoint is missing or corrupt, or does not fit the network (names the parameters:
            missing, unknown, shaped differently; a head of another shape needs ``model.pretrained_reinit``).
        ConfigError: ``model.pretrained_weights`` is not live/ema, or a ``model.freeze`` pattern matches nothing.
    """
    pretrained = node.get("pretrained")
    if pretrained:
        weights = str(node.get("pretrained_weights", "live"))
        if weights not in WEIGHTS:
            raise ConfigError(f"model.pretrained_weights={weights} is not valid: use live or ema (a training "
                              "checkpoint's EMA shadows)")
        reinit = [str(pattern) for pattern in node.get("pretrained_reinit") or []]
        try:
            values = network_weights(Path(str(pretrained)).expanduser(), weights)
            kept = load_weights(network, values, str(pretrained), reinit, option="model.pretrained_reinit")
        except CheckpointError as error:
            raise CheckpointError(f"model.pretrained: {error}") from error
        what = (f"trainer.resume={resume}: the checkpoint it resumes from replaces them, if it finds one" if resume
                else "a new run: optimizer, schedule, data order and EMA start fresh")
        log.info("model.pretrained: %d parameters loaded from %s (%s weights)%s; %s", len(values) - len(kept),
                 pretrained, weights, f"; re-initialised as the model initialises them: {listing(kept)}" if kept
                 else "", what)
    patterns = [str(pattern) for pattern in node.get("freeze") or []]
    if patterns:
        parameters = {p.name: p for p in network.trainable_params()}
        unmatched = [pattern for pattern in patterns if not matching(parameters, [pattern])]
        if unmatched:
            raise ConfigError(f"model.freeze: {', '.join(unmatched)} matches no trainable parameter of the model "
                              f"(they are named like {listing(list(parameters), 3)})")
        frozen = matching(parameters, patterns)
        for name in frozen:
            parameters[name].requires_grad = False
        log.info("model.freeze: %d parameters left out of the optimizer: %s", len(frozen), listing(frozen))
    if node.get("freeze_batch_norm", False):
        fixed = fix_frozen_batch_norms(network)
        log.info("model.freeze_batch_norm: %d batch norms whose gamma and beta are frozen use and keep their moving "
                 "statistics: %s", len(fixed), listing(fixed))


def fix_frozen_batch_norms(network: nn.Cell) -> list:
    """Batch norms whose gamma and beta are both frozen normalise with their moving statistics and leave them
    unchanged in training too, as ``backbone.eval()`` does in PyTorch; returns their names.

    Without it (the default, as PyTorch's ``train()``), a frozen layer's batch norm still normalises with the
    batch's statistics and moves its moving mean and variance towards the new data.
    """
    fixed = []
    for name, cell in network.cells_and_names():
        if isinstance(cell, _BatchNorm) and not cell.gamma.requires_grad and not cell.beta.requires_grad:
            cell.use_batch_statistics = False
            fixed.append(name)
    return fixed
