"""The tokenizer of ``data=text``: the user's, or one trained on the training split; and texts encoded by it.

A tokenizer is a ``tokenizers.Tokenizer`` (Hugging Face's ``tokenizers`` library, the ``text`` extra:
``pip install 'trainkit[text]'``), which is what a ``transformers`` fast tokenizer holds:

- ``data.tokenizer=FILE``: a ``tokenizer.json`` the library wrote (``Tokenizer.save``);
- ``data.tokenizer=DIR``: a folder ``transformers`` saved (``tokenizer.save_pretrained(DIR)``), whose
  ``tokenizer.json`` is read, and whose ``tokenizer_config.json`` names the pad token;
- none: one trained on the training split's texts (:func:`train_tokenizer`): ``wordpiece`` as BERT's uncased
  tokenizer is (lower-cased, accents stripped, ``[CLS] text [SEP]``, ``[PAD]`` id 0), or ``bpe`` as RoBERTa's is
  (byte-level, cased, ``<s> text </s>``, ``<pad>`` id 1), of at most ``vocab_size`` tokens.

Texts are encoded with the tokenizer's own special tokens, truncated to ``max_length`` tokens (the special tokens
kept: the text is cut before them) and padded to it with the pad token, as ``transformers`` does with
``truncation=True, padding="max_length"``; the attention mask is 1 on the tokens, 0 on the padding.

Files are read through :mod:`trainkit.data.input_file` (regular files only), ``tokenizer.json`` at most
:data:`MAX_TOKENIZER_BYTES`, ``tokenizer_config.json`` at most :data:`MAX_CONFIG_BYTES`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from trainkit.data.input_file import read_input
from trainkit.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
MAX_TOKENIZER_BYTES = 64 << 20  # the largest fast tokenizers published are a few tens of MB (Gemma's 34 MB)
MAX_CONFIG_BYTES = 1 << 20
TOKENIZER_MODELS = ("wordpiece", "bpe")
#: The special tokens of a trained tokenizer, in id order: BERT's for WordPiece, RoBERTa's for BPE.
SPECIAL_TOKENS = {"wordpiece": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
                  "bpe": ("<s>", "<pad>", "</s>", "<unk>", "<mask>")}
#: The pad tokens looked for when a tokenizer names none (its padding, or a transformers folder's config).
PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>")
MIN_VOCAB_SIZE = {"wordpiece": len(SPECIAL_TOKENS["wordpiece"]) + 1, "bpe": 256 + len(SPECIAL_TOKENS["bpe"])}


def tokenizers_module():
    """The ``tokenizers`` library, or ConfigError saying how to install it."""
    try:
        import tokenizers
    except ImportError as error:
        raise ConfigError("data=text needs the tokenizers library, which is not installed: pip install "
                          "'trainkit[text]'") from error
    return tokenizers


def load_tokenizer(path: Path, pad_token: Optional[str] = None) -> Tuple[Any, str, int]:
    """The tokenizer at `path` (a ``tokenizer.json``, or a folder holding one), its pad token and pad id.

    Raises:
        ConfigError: one line naming ``data.tokenizer`` -- the path is not a regular file or such a folder, is
            larger than :data:`MAX_TOKENIZER_BYTES`, is not a tokenizer, or names no pad token.
    """
    tokenizers = tokenizers_module()
    name = f"data.tokenizer={path}"
    config_pad = None
    file = path
    if path.is_dir():
        file = path / TOKENIZER_FILE
        if not os.path.lexists(file):
            raise ConfigError(f"{name} holds no {TOKENIZER_FILE}: give a tokenizer.json of the tokenizers library, "
                              "or a folder transformers saved with a fast tokenizer (save_pretrained)")
        if os.path.lexists(path / CONFIG_FILE):
            config_pad = _config_pad_token(path / CONFIG_FILE)
    text = read_input(file, MAX_TOKENIZER_BYTES, ConfigError, name if file == path else f"{name}: {file}")
    try:
        tokenizer = tokenizers.Tokenizer.from_str(text.decode("utf-8"))
    except Exception as error:  # noqa: BLE001 -- the library raises a bare Exception for a bad file
        raise ConfigError(f"{name}: {file.name} cannot be read as a tokenizer of the tokenizers library "
                          f"({_reason(error)})") from error
    token, pad_id = pad_of(tokenizer, pad_token or config_pad, name)
    return tokenizer, token, pad_id


def _config_pad_token(path: Path) -> Optional[str]:
    """The pad token a transformers ``tokenizer_config.json`` names (a string, or ``{"content": ...}``), if any."""
    data = read_input(path, MAX_CONFIG_BYTES, ConfigError, f"data.tokenizer: {path}")
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"data.tokenizer: {path} is not JSON ({_reason(error)})") from error
    pad = config.get("pad_token") if isinstance(config, dict) else None
    if isinstance(pad, dict):
        pad = pad.get("content")
    return pad if isinstance(pad, str) and pad else None


def pad_of(tokenizer: Any, pad_token: Optional[str], name: str) -> Tuple[str, int]:
    """(pad token, its id): `pad_token` where given, else the tokenizer's padding's, else the first of
    :data:`PAD_TOKENS` it holds; ConfigError naming `name` when none is, or the token is not in the vocabulary."""
    if pad_token is None and tokenizer.padding:
        pad_token = tokenizer.padding.get("pad_token")
    if pad_token is None:
        pad_token = next((token for token in PAD_TOKENS if tokenizer.token_to_id(token) is not None), None)
    if pad_token is None:
        raise ConfigError(f"{name}: the tokenizer names no pad token and holds none of {', '.join(PAD_TOKENS)}: "
                          "set data.pad_token to one of its tokens (a GPT-2 tokenizer's <|endoftext|>)")
    pad_id = tokenizer.token_to_id(pad_token)
    if pad_id is None:
        raise ConfigError(f"data.pad_token={pad_token} is not a token of the tokenizer ({name})")
    return pad_token, int(pad_id)


def train_tokenizer(texts: Sequence[str], model: str, vocab_size: int) -> Tuple[Any, str, int]:
    """A `model` tokenizer (``wordpiece`` or ``bpe``) of at most `vocab_size` tokens trained on `texts`, its pad
    token and pad id. The same texts give the same tokenizer, in any process (:func:`_train_wordpiece` says how)."""
    tokenizers = tokenizers_module()
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    specials = list(SPECIAL_TOKENS[model])
    if model == "wordpiece":  # bert-base-uncased's pipeline
        tokenizer = _train_wordpiece(texts, vocab_size, specials)
        first, last = "[CLS]", "[SEP]"
    else:  # roberta-base's: byte-level, so no text is unknown
        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(list(texts), trainer=trainer)
        first, last = "<s>", "</s>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", special_tokens=[(t, tokenizer.token_to_id(t)) for t in (first, last)])
    pad_token = specials[0] if model == "wordpiece" else "<pad>"
    return tokenizer, pad_token, int(tokenizer.token_to_id(pad_token))


def _train_wordpiece(texts: Sequence[str], vocab_size: int, specials: List[str]) -> Any:
    """A WordPiece tokenizer as the library's ``WordPieceTrainer`` makes one, made the same by every training.

    ``WordPieceTrainer`` is a BPE trainer over each word's characters, a character after the word's first standing
    for its continuation piece (``##c``). It numbers those pieces in the order of a hash map, random in each process,
    and breaks ties between equal pair counts by the numbers: two trainings on the same texts give different
    vocabularies (the ids of the ``##`` pieces of 42 short texts differed), and a resumed run would get another
    tokenizer. Its BPE trainer
    over plain characters is deterministic (its alphabet sorted, no piece numbered on the way). So the words are
    normalised and split as BERT's are, each later character is replaced by a private-use character of its own (the
    continuation as a character), the BPE trainer learns the merges, and its vocabulary is read back, the private-use
    characters as ``##`` pieces, in its order."""
    tokenizers = tokenizers_module()
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = [word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
    characters = sorted({character for word in words for character in word})
    present = set(characters)
    free = (chr(code) for code in (*range(0xF0000, 0xFFFFE), *range(0x100000, 0x10FFFE)) if chr(code) not in present)
    continuation = {character: next(free) for character in characters}
    back = {mark: "##" + character for character, mark in continuation.items()}
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=characters)  # every character as a word's first, as WordPiece's
    bpe.train_from_iterator([word[0] + "".join(continuation[c] for c in word[1:]) for word in words], trainer=trainer)
    vocab: Dict[str, int] = {}
    for token, _ in sorted(bpe.get_vocab().items(), key=lambda item: item[1]):
        if token not in specials:  # a piece: its first character says whether it starts a word
            token = back[token[0]] + "".join(back[c][2:] for c in token[1:]) if token[0] in back else \
                token[0] + "".join(back[c][2:] for c in token[1:])
        vocab[token] = len(vocab)
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(specials)
    return tokenizer


def encode(tokenizer: Any, texts: Sequence[str], max_length: int, pad_token: str,
           pad_id: int) -> Tuple[np.ndarray, np.ndarray]:
    """(token ids, attention mask), int32 ``[len(texts), max_length]`` each: every text with the tokenizer's
    special tokens, truncated to `max_length` (the special tokens kept), padded with `pad_id`; the mask 1 on the
    tokens, 0 on the padding."""
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token, length=max_length)
    encodings = tokenizer.encode_batch(list(texts))
    ids = np.asarray([encoding.ids for encoding in encodings], np.int32).reshape(len(encodings), max_length)
    mask = np.asarray([encoding.attention_mask for encoding in encodings], np.int32).reshape(ids.shape)
    return ids, mask


def special_token_count(tokenizer: Any) -> int:
    """How many special tokens the tokenizer adds to one text (``[CLS]`` and ``[SEP]``: 2)."""
    return int(tokenizer.num_special_tokens_to_add(False))


def tokenizer_state(tokenizer: Any) -> Dict[str, Any]:
    """The tokenizer as the JSON object its ``tokenizer.json`` holds (what a run's data state keeps), without the
    truncation and padding :func:`encode` set: the state keeps ``max_length`` and the pad token beside it."""
    state = json.loads(tokenizer.to_str())
    state["truncation"], state["padding"] = None, None
    return state


def tokenizer_from_state(state: Any, where: str) -> Any:
    """The tokenizer :func:`tokenizer_state` gave; ConfigError naming `where` when it is not one."""
    tokenizers = tokenizers_module()
    try:
        return tokenizers.Tokenizer.from_str(json.dumps(state))
    except Exception as error:  # noqa: BLE001 -- a bare Exception from the library
        raise ConfigError(f"{where}: the stored tokenizer cannot be read ({_reason(error)})") from error


def _reason(error: BaseException) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__
