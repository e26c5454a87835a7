"""Labelled texts in a CSV or Parquet table as a data module: ``data=text data.path=FILE`` (columns text, label).

Columns: ``text`` holds the texts, ``target`` their labels (``data.text``, ``data.target``). Classes are the labels'
distinct values, sorted (numbers by value when every label is a number), named as the file writes them
(``class_names``), as ``data=table`` names a classification's. A text or a label left empty (an empty CSV cell, a
Parquet null) is refused in one line naming the column and the row; every other cell is text as written (``NA``
is a word here, not a missing value). Rows are numbered from 0, the first row below the header.

Tokens: the texts are tokenised by ``tokenizer`` (a ``tokenizer.json`` of the ``tokenizers`` library, or a folder
``transformers`` saved), or by a WordPiece or BPE tokenizer of at most ``vocab_size`` tokens trained on the
training split's texts alone (``tokenizer_model``), then truncated or padded to ``max_length`` tokens
(:mod:`trainkit.data.tokenizer`).

Splits: ``test_fraction`` then ``val_fraction`` of the rows, per class, by ``split_seed`` (``data=table``'s
split). Batches are ``data=table``'s too (:mod:`trainkit.data.array_batches`): a resumed run replays the same
order (``trainer.resume_data=exact``).

What the network gets: ``input_ids`` int32 ``[batch, max_length]``, and ``label`` int32 ``[batch]``. The
attention mask is ``input_ids != pad_id`` (the tokenizer's pad token never stands for a text's token); a network
computes it from the ids, as trainkit's :class:`~trainkit.models.text.TextBag` and a ``transformers`` model ported
by ``python -m trainkit.port`` do (the port's ``attention_mask=(input_ids != pad id)``): its ``pad_token_id`` must
be the tokenizer's pad id, which the start-up line names. ``attention_mask(ids)`` gives the mask as arrays.

Attributes that fill the model's keys: ``vocab_size`` (the tokenizer's), ``pad_id``, ``num_classes``,
``max_length``.

What the run keeps: :meth:`state_dict` holds the tokenizer (its ``tokenizer.json`` as a JSON object), the pad
token and id, ``max_length``, the columns and the classes; the app stores it in ``data_state.json`` and every
checkpoint, so ``python -m trainkit.predict RUN "a sentence"`` reads no training file.

Prediction (``predict_samples``): each input is a sentence, or a file: a ``.txt`` file (a text a line, blank lines
skipped; ids ``FILE:LINE``, lines counted from 1) or a ``.csv``/``.parquet`` table with the text column (ids
``FILE:ROW``). An input that names an existing path, or looks like a file name (one word ending in ``.txt``,
``.csv`` or ``.parquet``), is read as a file; anything else is a sentence, its id the sentence itself.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from trainkit.checks import check_int
from trainkit.data.input_file import read_input
from trainkit.data.predict_inputs import Sample
from trainkit.data.table import class_name, split_rows
from trainkit.data.table_file import MISSING, SUFFIXES, read_table
from trainkit.data.tabular import RowSplitDatasets
from trainkit.data.tokenizer import (
    MIN_VOCAB_SIZE,
    TOKENIZER_MODELS,
    encode,
    load_tokenizer,
    special_token_count,
    tokenizer_from_state,
    tokenizer_state,
    tokenizers_module,
    train_tokenizer,
)
from trainkit.data.values import check_values
from trainkit.errors import ConfigError, DataError

log = logging.getLogger("trainkit")

STATE_VERSION = 1
MAX_LENGTH = 1 << 16  # tokens a text: the arrays are rows x max_length int32 (twice, with the masks)
MAX_VOCAB_SIZE = 1 << 20
TEXT_FILE_SUFFIXES = (".txt",)
MAX_TEXT_FILE_BYTES = 256 << 20  # a .txt file of sentences to predict
COLUMNS = ("input_ids", "label")


class TextData(RowSplitDatasets):
    """Texts and their classes from a table, tokenised and split.

    Args:
        path: the .csv or .parquet file.
        text: the column of texts.
        target: the column of labels (class names: text or whole numbers).
        tokenizer: a ``tokenizer.json`` file, or a folder ``transformers`` saved; None: one trained on the training
            split.
        tokenizer_model: the tokenizer trained when none is given: ``wordpiece`` (BERT's, uncased) or ``bpe``
            (RoBERTa's byte-level one).
        vocab_size: the trained tokenizer's most tokens (specials included); fewer when the texts hold fewer.
        max_length: tokens a text, special tokens included: longer texts are cut, shorter ones padded.
        pad_token: the token padding is made of (None: the tokenizer's, or ``[PAD]``/``<pad>``).
        batch_size: training batch size; the last incomplete batch is dropped.
        eval_batch_size: evaluation batch size (None: the split in one batch).
        test_fraction: share of the rows held out as the test set, in [0, 1); 0: no test split.
        val_fraction: share of the rows carved for validation, in (0, 1), test_fraction + val_fraction < 1.
        split_seed: seed of the split.

    After ``prepare()`` (or ``load_state_dict``): ``class_names``, ``num_classes``, ``vocab_size`` (the
    tokenizer's), ``pad_id``, ``pad_token``, ``tokenizer`` (a ``tokenizers.Tokenizer``).
    """

    values_checked = True  # prepare() checks every id and label (trainkit.data.check_values)
    suggested_model = "model=text_bag, or recipe=text_classification"  # said when another model cannot build
    columns = COLUMNS  # what the network is fed: "input_ids" int32 (B, max_length), "label" int32 (B,)

    def __init__(self, path: Union[str, os.PathLike, None] = None, text: str = "text", target: str = "label",
                 tokenizer: Union[str, os.PathLike, None] = None, tokenizer_model: str = "wordpiece",
                 vocab_size: int = 8000, max_length: int = 128, pad_token: Optional[str] = None,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None, test_fraction: float = 0.2,
                 val_fraction: float = 0.1, split_seed: int = 0):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ConfigError(f"path must be a .csv or .parquet file of texts and labels (data.path=FILE); got "
                              f"{path!r}")
        self.path = Path(os.path.abspath(os.path.expanduser(str(path))))  # links kept, as data=table's
        if self.path.suffix.lower() not in SUFFIXES:
            raise ConfigError(f"path must be a .csv or .parquet file; got {str(path)!r}")
        for name, value in (("text", text), ("target", target)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must name a column of {self.path.name} (data.{name}=COLUMN); got {value!r}")
        if text == target:
            raise ConfigError(f"text and target name the same column ({text!r}): the texts and their labels are two "
                              "columns")
        self.text, self.target = text, target
        if tokenizer is not None and (not isinstance(tokenizer, (str, os.PathLike)) or not str(tokenizer)):
            raise ConfigError(f"tokenizer must be a tokenizer.json file or a folder holding one, or null (trained on "
                              f"the training split); got {tokenizer!r}")
        self.tokenizer_path = (None if tokenizer is None
                               else Path(os.path.abspath(os.path.expanduser(str(tokenizer)))))
        if tokenizer_model not in TOKENIZER_MODELS:
            raise ConfigError(f"tokenizer_model must be one of {', '.join(TOKENIZER_MODELS)}; got {tokenizer_model!r}")
        self.tokenizer_model = tokenizer_model
        low = MIN_VOCAB_SIZE[tokenizer_model]
        self.vocab_size: Optional[int] = check_int("vocab_size", vocab_size, low) if tokenizer is None else None
        if self.vocab_size is not None and self.vocab_size > MAX_VOCAB_SIZE:
            raise ConfigError(f"vocab_size must be at most {MAX_VOCAB_SIZE:,}; got {vocab_size!r}")
        self.max_length = check_int("max_length", max_length, 1)
        if self.max_length > MAX_LENGTH:
            raise ConfigError(f"max_length must be at most {MAX_LENGTH:,} tokens; got {max_length!r}")
        if pad_token is not None and (not isinstance(pad_token, str) or not pad_token):
            raise ConfigError(f"pad_token must be a token of the tokenizer, or null; got {pad_token!r}")
        self.pad_token: Optional[str] = pad_token
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.eval_batch_size = None if eval_batch_size is None else check_int("eval_batch_size", eval_batch_size, 1)
        for name, value, low_bracket in (("test_fraction", test_fraction, "["), ("val_fraction", val_fraction, "(")):
            if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0
                    or (low_bracket == "(" and float(value) == 0.0)):
                zero = " (0: no test split, for a test set kept elsewhere)" if low_bracket == "[" else ""
                raise ConfigError(f"{name} must be a number in {low_bracket}0, 1){zero}; got {value!r}")
        if float(test_fraction) + float(val_fraction) >= 1.0:
            raise ConfigError(f"val_fraction must leave rows to train on: test_fraction + val_fraction < 1; got "
                              f"{test_fraction!r} + {val_fraction!r}")
        self.test_fraction, self.val_fraction = float(test_fraction), float(val_fraction)
        self.split_seed = check_int("split_seed", split_seed, 0)
        tokenizers_module()  # the library's absence is said now, before any file is read
        self.tokenizer: Any = None
        self.pad_id: Optional[int] = None
        self.class_names: Optional[List[str]] = None
        self.num_classes: Optional[int] = None
        self._state: Optional[Dict[str, Any]] = None
        self._arrays: Optional[Dict[str, Tuple[np.ndarray, np.ndarray]]] = None

    def __repr__(self) -> str:
        return f"TextData(path={str(self.path)!r}, text={self.text!r}, target={self.target!r})"

    # ---------------------------------------------------------------------------------------------- prepare
    def prepare(self) -> None:
        """Read the table, name the classes, split the rows, take or train the tokenizer, encode every text.

        After :meth:`load_state_dict` the stored tokenizer and classes are kept (an evaluation of a trained run);
        a label the run never saw is then refused."""
        table = read_table(self.path, raw=True)
        for key in ("text", "target"):
            column = getattr(self, key)
            if column not in table.columns:
                raise ConfigError(f"data.{key}={column} is not a column of {self.path}: its columns are "
                                  f"{', '.join(table.columns)}")
        texts = self._texts(table.columns[self.text], str(self.path))
        names = self._labels(table.columns[self.target])
        if self._state is None:
            classes = _sorted_classes(names)
            if len(classes) < 2:
                raise DataError(f"{self.path}: column {self.target!r} holds a single class ({classes[0]!r}): a "
                                "classification needs at least two")
        else:
            classes = list(self._state["classes"])
            unknown = next((row for row, name in enumerate(names) if name not in classes), None)
            if unknown is not None:
                raise DataError(f"{self.path}: row {unknown} is labelled {names[unknown]!r}, a class the run did not "
                                f"train on ({', '.join(classes)})")
        index = {name: i for i, name in enumerate(classes)}
        labels = np.asarray([index[name] for name in names], np.int32)
        train, val, test = split_rows(labels, table.rows, self.test_fraction, self.val_fraction, self.split_seed)
        if self._state is None:
            if self.tokenizer_path is not None:
                tokenizer, pad_token, pad_id = load_tokenizer(self.tokenizer_path, self.pad_token)
            else:
                tokenizer, pad_token, pad_id = train_tokenizer([texts[row] for row in train], self.tokenizer_model,
                                                               self.vocab_size)
            self._take(tokenizer, pad_token, pad_id, classes, self.max_length)
        ids, _ = self.encode(texts)
        check_values(str(self.path), {"input_ids": ids}, {"label": labels}, self.num_classes)
        self._arrays = {name: (ids[rows], labels[rows]) for name, rows in
                        (("train", train), ("val", val), ("test", test))}
        source = (f"tokenizer {self.tokenizer_path}" if self.tokenizer_path is not None
                  else f"{self.tokenizer_model} tokenizer trained on the training texts")
        lengths = (ids != self.pad_id).sum(axis=1)
        full = int((lengths >= self.max_length).sum())  # the longer texts were cut to fit
        log.info("text %s: %d rows (%d train, %d val, %d test), %d classes; %s, %d tokens, pad %s = id %d; "
                 "%d texts (%.0f%%) reach max_length=%d", self.path, table.rows, len(train), len(val), len(test),
                 len(classes), source, self.vocab_size, self.pad_token, self.pad_id, full, 100.0 * full / len(ids),
                 self.max_length)

    def _take(self, tokenizer: Any, pad_token: str, pad_id: int, classes: List[str], max_length: int) -> None:
        if special_token_count(tokenizer) >= max_length:
            raise ConfigError(f"data.max_length={max_length} leaves no room for a text: the tokenizer adds "
                              f"{special_token_count(tokenizer)} special tokens to each")
        self.tokenizer, self.pad_token, self.pad_id = tokenizer, pad_token, pad_id
        self.max_length = max_length
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self.class_names, self.num_classes = list(classes), len(classes)
        self._state = {"version": STATE_VERSION, "text": self.text, "target": self.target,
                       "classes": list(classes), "max_length": max_length, "pad_token": pad_token,
                       "pad_id": pad_id}

    def _texts(self, values: Sequence[Optional[str]], where: str) -> List[str]:
        empty = next((row for row, value in enumerate(values) if value is None), None)
        if empty is not None:
            raise DataError(f"{where}: column {self.text!r} has no text in row {empty}: give every row a text, or "
                            "remove the row")
        return [str(value) for value in values]

    def _labels(self, values: Sequence[Optional[str]]) -> List[str]:
        missing = next((row for row, value in enumerate(values) if value is None or value in MISSING), None)
        if missing is not None:
            raise DataError(f"{self.path}: column {self.target!r} (the labels) has no value in row {missing} "
                            f"({values[missing]!r}): a label is never filled; fix or remove the row")
        numbers = [_number(value) for value in values]
        if all(number is not None for number in numbers):  # class names as data=table writes them: 3.0 is "3"
            return [class_name(number) for number in numbers]
        return [str(value) for value in values]

    # ------------------------------------------------------------------------------------------- tokens
    def encode(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """(token ids, attention mask) of `texts`, int32 ``[len(texts), max_length]`` each
        (:func:`trainkit.data.tokenizer.encode`)."""
        if self.tokenizer is None:
            self.prepare()
        return encode(self.tokenizer, texts, self.max_length, self.pad_token, self.pad_id)

    def attention_mask(self, ids: np.ndarray) -> np.ndarray:
        """The attention mask of token ids as the network computes it: 1 where the id is not the pad id."""
        return (np.asarray(ids) != self.pad_id).astype(np.int32)

    # ---------------------------------------------------------------------------------------------- state
    def state_dict(self) -> Optional[Dict[str, Any]]:
        """What a prediction needs (JSON-able): the tokenizer, its pad token and id, max_length, columns, classes."""
        if self._state is None:
            return None
        return {**self._state, "tokenizer": tokenizer_state(self.tokenizer)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take the tokenizer and classes of a trained run (:meth:`state_dict`), for :meth:`predict_samples`."""
        where = "the stored text data state"
        if (not isinstance(state, dict) or state.get("version") != STATE_VERSION or state.get("text") != self.text
                or not isinstance(state.get("classes"), list) or not isinstance(state.get("pad_id"), int)
                or not isinstance(state.get("max_length"), int) or not isinstance(state.get("pad_token"), str)):
            raise DataError(f"{where} is not that of texts in column {self.text!r} (version {STATE_VERSION})")
        tokenizer = tokenizer_from_state(state.get("tokenizer"), where)
        self._take(tokenizer, state["pad_token"], state["pad_id"], [str(c) for c in state["classes"]],
                   state["max_length"])

    def _split(self, which: str) -> Tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self.prepare()
        assert self._arrays is not None
        return self._arrays[which]

    # ------------------------------------------------------------------------------------------- prediction
    def predict_samples(self, inputs: Sequence[str]) -> Iterator[Sample]:
        """``(id, token ids int32 [max_length], None)`` per sentence, per line of a ``.txt`` file and per row of
        a table, or ``(id, None, error line)``: a file that cannot be read, a row without text."""
        if self.tokenizer is None:
            self.prepare()
        for item in inputs:
            item = str(item)
            if not _names_a_file(item):
                ids, _ = self.encode([item])
                yield item, ids[0], None
                continue
            path = Path(item)
            try:
                named, texts, problems = self._file_texts(path)
            except DataError as error:
                yield item, None, str(error)
                continue
            ids, _ = self.encode([text for text in texts if text is not None]) if any(
                text is not None for text in texts) else (np.zeros((0, self.max_length), np.int32), None)
            encoded = iter(ids)
            for name, text, problem in zip(named, texts, problems):
                if text is None:
                    yield name, None, problem
                else:
                    yield name, next(encoded), None

    def _file_texts(self, path: Path) -> Tuple[List[str], List[Optional[str]], List[Optional[str]]]:
        """(ids, texts, error lines) of a .txt file's non-blank lines or a table's rows; DataError for the file."""
        suffix = path.suffix.lower()
        if suffix in TEXT_FILE_SUFFIXES:
            data = read_input(path, MAX_TEXT_FILE_BYTES)
            try:
                lines = data.decode("utf-8-sig").splitlines()
            except UnicodeDecodeError as error:
                raise DataError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from error
            kept = [(number, line.strip()) for number, line in enumerate(lines, 1) if line.strip()]
            if not kept:
                raise DataError(f"{path} holds no text: one text a line")
            return [f"{path}:{n}" for n, _ in kept], [text for _, text in kept], [None] * len(kept)
        if suffix not in SUFFIXES:
            raise DataError(f"{path} is not a text file: give sentences, .txt files (a text a line) or "
                            f"{', '.join(SUFFIXES)} tables with a {self.text!r} column")
        table = read_table(path, raw=True)
        if self.text not in table.columns:
            raise DataError(f"{path} has no column {self.text!r}, the texts the model was trained on: its columns "
                            f"are {', '.join(table.columns)}")
        values = table.columns[self.text]
        problems = [None if value is not None else f"{path}: column {self.text!r} has no text in row {row}"
                    for row, value in enumerate(values)]
        return [f"{path}:{row}" for row in range(table.rows)], list(values), problems


def _number(value: str) -> Optional[float]:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _sorted_classes(names: Sequence[str]) -> List[str]:
    numbers = {name: _number(name) for name in set(names)}
    if all(number is not None for number in numbers.values()):
        return sorted(numbers, key=lambda name: (numbers[name], name))
    return sorted(numbers)


def _names_a_file(item: str) -> bool:
    """Whether a prediction input is a file: an existing path, or one word ending as a file this module reads
    (a file that does not exist is then said, rather than its name predicted as a sentence)."""
    if os.path.lexists(item):  # never raises: a sentence longer than a file name is simply not one
        return True
    return (not any(character.isspace() for character in item)
            and Path(item).suffix.lower() in (*TEXT_FILE_SUFFIXES, *SUFFIXES))
