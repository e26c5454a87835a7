"""Hugging Face ``transformers`` models for the port zoo's transformers section, each built from a small config as
a user builds one in a test (random weights, nothing downloaded): ``bench.hf_models:NAME`` is what
``python -m trainkit.port`` takes. ``import transformers`` imports torchvision where it is installed, so torch is
imported first as trainkit's bridge imports it (:func:`trainkit.bridge.torch_import.import_torch`)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from trainkit.bridge.torch_import import import_torch

import_torch()
import transformers  # noqa: E402 - after torchvision's schemas

VOCAB = 100
TEXT = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 64, "num_labels": 3}


def bert():
    return transformers.BertForSequenceClassification(transformers.BertConfig(**TEXT))


def distilbert():
    return transformers.DistilBertForSequenceClassification(transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=64, num_labels=3))


def roberta():
    return transformers.RobertaForSequenceClassification(transformers.RobertaConfig(**TEXT))


def albert():
    return transformers.AlbertForSequenceClassification(transformers.AlbertConfig(**TEXT, embedding_size=8))


def gpt2():
    return transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64, num_labels=3, pad_token_id=0,
        bos_token_id=1, eos_token_id=1))


def vit():
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, num_labels=3))


def electra():
    return transformers.ElectraForSequenceClassification(transformers.ElectraConfig(**TEXT, embedding_size=8))


def swin():
    return transformers.SwinForImageClassification(transformers.SwinConfig(
        image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
        num_labels=3))


def convnext():
    return transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
        num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3))


def bert_mlm():
    """BERT's masked-language-model head: its decoder's weight is the word embeddings' table, its bias the head's
    ``bias`` (two ties)."""
    return transformers.BertForMaskedLM(transformers.BertConfig(**TEXT))


def gpt2_lm():
    """GPT-2's language-model head, whose weight is the token embeddings' table (no pad id: GPT-2's default)."""
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=1))


def deberta_v2():
    """With the relative attention of DeBERTa-v3's configs (what a fine-tuned DeBERTa brings)."""
    return transformers.DebertaV2ForSequenceClassification(transformers.DebertaV2Config(
        **TEXT, relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        position_buckets=16))


def t5():
    return transformers.T5ForSequenceClassification(transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
        num_labels=3, pad_token_id=0, decoder_start_token_id=0))


def t5_encoder():
    """T5's encoder alone (its embeddings shared with the unused decoder's: one tie)."""
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, pad_token_id=0))


def mobilebert():
    return transformers.MobileBertForSequenceClassification(transformers.MobileBertConfig(
        **TEXT, embedding_size=8, intra_bottleneck_size=8, num_feedforward_networks=1))


def xlm_roberta():
    return transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(**TEXT))


def mpnet():
    return transformers.MPNetForSequenceClassification(transformers.MPNetConfig(**TEXT))


def bart():
    return transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, num_labels=3,
        pad_token_id=1, bos_token_id=0, eos_token_id=2))


def opt_lm():
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
        max_position_embeddings=64, word_embed_proj_dim=16, pad_token_id=1, bos_token_id=2, eos_token_id=2))


def bloom():
    return transformers.BloomForSequenceClassification(transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=16, n_layer=2, n_head=2, num_labels=3, pad_token_id=0))


# (label, factory name, one sample's shape, --input-ints): the six, the others of their families that
# port, two that stop, and the ones tried as a new user would (docs/coming-from-pytorch.md)
MODELS: List[Tuple[str, str, List[int], Optional[int]]] = [
    ("BertForSequenceClassification", "bert", [16], VOCAB),
    ("DistilBertForSequenceClassification", "distilbert", [16], VOCAB),
    ("RobertaForSequenceClassification", "roberta", [16], VOCAB),
    ("AlbertForSequenceClassification", "albert", [16], VOCAB),
    ("GPT2ForSequenceClassification", "gpt2", [16], VOCAB),
    ("ViTForImageClassification", "vit", [3, 16, 16], None),
    ("ElectraForSequenceClassification", "electra", [16], VOCAB),
    ("SwinForImageClassification", "swin", [3, 32, 32], None),
    ("ConvNextForImageClassification", "convnext", [3, 32, 32], None),
    ("BertForMaskedLM", "bert_mlm", [16], VOCAB),
    ("GPT2LMHeadModel", "gpt2_lm", [16], VOCAB),
    ("DebertaV2ForSequenceClassification", "deberta_v2", [16], VOCAB),
    ("T5ForSequenceClassification", "t5", [16], VOCAB),
    ("T5EncoderModel", "t5_encoder", [16], VOCAB),
    ("MobileBertForSequenceClassification", "mobilebert", [16], VOCAB),
    ("XLMRobertaForSequenceClassification", "xlm_roberta", [16], VOCAB),
    ("MPNetForSequenceClassification", "mpnet", [16], VOCAB),
    ("BartForSequenceClassification", "bart", [16], VOCAB),
    ("OPTForCausalLM", "opt_lm", [16], VOCAB),
    ("BloomForSequenceClassification", "bloom", [16], VOCAB),
]


def cases() -> List[Tuple[str, str, Dict[str, Any], List[int], Any, Optional[int]]]:
    """(label, MODULE:FACTORY, arguments, sample shape, factory, --input-ints) of every model of the section."""
    return [(f"transformers {label}", f"{__name__}:{name}", {}, shape, globals()[name], ints)
            for label, name, shape, ints in MODELS]
