"""Hugging Face ``transformers`` models as a user builds them in a test: a small config, random weights, nothing
downloaded. ``import transformers`` imports torchvision where it is installed, so torch is imported as trainkit's
bridge imports it (:func:`trainkit.bridge.torch_import.import_torch`: torchvision's two operator schemas defined
where its C++ operators do not load). Each factory seeds torch, so a second call builds the same weights."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from trainkit.bridge.torch_import import import_torch  # noqa: E402 - after the skip where torch is missing

import_torch()
transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 64, "num_labels": 3}


def bert(**changes):
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(transformers.BertConfig(**{**TINY, **changes})).eval()


def roberta(**changes):
    torch.manual_seed(0)
    return transformers.RobertaForSequenceClassification(transformers.RobertaConfig(**{**TINY, **changes})).eval()


def albert(**changes):
    torch.manual_seed(0)
    return transformers.AlbertForSequenceClassification(
        transformers.AlbertConfig(**{**TINY, "embedding_size": 8, **changes})).eval()


def distilbert(**changes):
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=100, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                           max_position_embeddings=64, num_labels=3, **changes)
    return transformers.DistilBertForSequenceClassification(config).eval()


def gpt2(**changes):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=16, n_layer=2, n_head=2, n_positions=64, num_labels=3,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=1, **changes)
    return transformers.GPT2ForSequenceClassification(config).eval()


def vit(**changes):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=3, **changes)
    return transformers.ViTForImageClassification(config).eval()


def gpt2_lm(**changes):
    """GPT-2 with its language-model head, whose weight is the token embedding's table (tie_word_embeddings), and
    no pad id (GPT-2's default)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=64, bos_token_id=1,
                                     eos_token_id=1, **changes)
    return transformers.GPT2LMHeadModel(config).eval()


def bert_mlm(**changes):
    """BERT with its masked-language-model head: the decoder's weight is the word embeddings' table and its bias the
    head's own ``bias`` (two tied Parameters), the pad id 0 (BERT's default)."""
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(transformers.BertConfig(**{**TINY, **changes})).eval()


class SmallestFilled(torch.nn.Module):
    """What transformers' eager attention masks do: fill with ``torch.finfo(x.dtype).min`` of a traced tensor's
    dtype."""

    def forward(self, x):
        return torch.where(x > 0.5, torch.zeros((), dtype=x.dtype), torch.finfo(x.dtype).min) + x
