"""A small text classifier: token embeddings averaged over a text's tokens (its attention mask), then an MLP.

The default network of ``data=text`` (``model=text_bag``): a few seconds a run on a CPU for a small CSV, with no
pretrained weights. A fine-tuned transformer comes over with ``python -m trainkit.port`` instead.
"""
from __future__ import annotations

from typing import Sequence

import mindspore as ms
from mindspore import nn, ops

from trainkit.checks import check_int, check_number
from trainkit.models.dropout import Dropout

__all__ = ["TextBag"]


class TextBag(nn.Cell):
    """Token ids ``[batch, length]`` -> embeddings (``embed_dim``) -> their mean over the tokens whose id is not
    ``pad_id`` (the attention mask) -> each of ``hidden_sizes`` (Dense, ReLU, optional dropout) -> ``num_classes``
    logits. PyTorch's ``nn.EmbeddingBag(mode="mean")`` with an MLP after it.

    Args:
        vocab_size: rows of the embedding table (null in the config: the data's ``vocab_size``, its tokenizer's).
        num_classes: outputs (null: the data's ``num_classes``).
        pad_id: the padding's token id, left out of the mean (null: the data's ``pad_id``); its embedding row
            stays zero and takes no gradient.
        embed_dim: width of a token's embedding.
        hidden_sizes: widths of the hidden layers; empty for a linear classifier of the mean embedding.
        dropout: dropout probability after each hidden layer, in [0, 1); 0: none (trainkit's resumable Dropout).
    """

    def __init__(self, vocab_size: int, num_classes: int, pad_id: int = 0, embed_dim: int = 64,
                 hidden_sizes: Sequence[int] = (64,), dropout: float = 0.0):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, 1)
        self.num_classes = check_int("num_classes", num_classes, 1)
        self.pad_id = check_int("pad_id", pad_id, 0)
        if self.pad_id >= self.vocab_size:
            raise ValueError(f"pad_id must be a token id below vocab_size={self.vocab_size}; got {pad_id}")
        embed_dim = check_int("embed_dim", embed_dim, 1)
        dropout = float(check_number("dropout", dropout, "a number in [0, 1)", lambda v: 0 <= v < 1))
        self.embedding = nn.Embedding(self.vocab_size, embed_dim, padding_idx=self.pad_id)
        layers = []
        width = embed_dim
        for index, size in enumerate(hidden_sizes):
            size = check_int(f"hidden_sizes[{index}]", size, 1)
            layers += [nn.Dense(width, size), nn.ReLU()]
            if dropout > 0:
                layers.append(Dropout(p=dropout))
            width = size
        layers.append(nn.Dense(width, self.num_classes))
        self.head = nn.SequentialCell(layers)

    def construct(self, input_ids):
        mask = (input_ids != self.pad_id).astype(ms.float32)  # the attention mask
        vectors = self.embedding(input_ids) * ops.expand_dims(mask, -1)
        counts = ops.clamp(mask.sum(axis=1, keepdims=True), min=1.0)  # a text of padding alone: zeros, not 0/0
        return self.head(vectors.sum(axis=1) / counts)
