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

from omegaconf import DictConfig, OmegaConf

#: Keys of the model node that configure fine-tuning rather than the model's constructor.
FINETUNE_KEYS = ("pretrained", "pretrained_weights", "pretrained_reinit", "freeze")


def model_arguments(node: DictConfig) -> DictConfig:
    """The model node without the fine-tuning keys: what ``hydra.utils.instantiate`` passes to the constructor."""
    if not any(key in node for key in FINETUNE_KEYS):
        return node
    container = OmegaConf.to_container(node, resolve=True)
    for key in FINETUNE_KEYS:
        container.pop(key, None)
    return OmegaConf.create(container)
