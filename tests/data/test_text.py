"""data=text: texts tokenised as the tokenizers library tokenises them (its own trainer, a tokenizer.json, a folder
transformers saved), truncated, padded and masked as NumPy computes it, split per class by the seed, the tokenizer
trained on the training rows alone; a short run, then predictions on raw text once the CSV is gone; bad keys and
files stop in one line naming them."""
import csv
import json
import os
import random

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from trainkit.data.text import TextData, _names_a_file  # noqa: E402
from trainkit.errors import ConfigError, DataError  # noqa: E402

WORDS = ["good", "bad", "film", "plot", "acting", "lovely", "awful", "warm", "cold", "funny", "boring", "the", "a",
         "and", "was", "very", "not", "story", "music", "ending"]
CLASSES = ["neg", "pos", "meh"]


def write_texts(path, count=60, seed=0, held_out_word=None, text_column="text", label_column="label"):
    """`count` rows of 2-14 words drawn by random.Random(seed) and labels cycling through CLASSES; the rows of the
    validation and test splits (by :func:`expected_split`) end with `held_out_word` where given."""
    generator = random.Random(seed)
    labels = [CLASSES[row % 3] for row in range(count)]
    held = set() if held_out_word is None else set(np.concatenate(expected_split(labels)[1:]).tolist())
    texts = []
    for row in range(count):
        words = [generator.choice(WORDS) for _ in range(generator.randint(2, 14))]
        texts.append(" ".join(words + ([held_out_word] if row in held else [])).capitalize())
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow([text_column, label_column])
        writer.writerows(zip(texts, labels))
    return texts, labels


def expected_split(labels, test_fraction=0.2, val_fraction=0.1, seed=0):
    """(train, val, test) rows: per class in sorted order, a permutation by default_rng(seed) whose first
    round(test_fraction * n) rows are test and the next round(val_fraction * n) validation (at least one each)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts = {"train": [], "val": [], "test": []}
    for name in sorted(set(labels.tolist())):
        members = rng.permutation(np.flatnonzero(labels == name))
        test = min(len(members) - 1, max(1, round(test_fraction * len(members)))) if test_fraction else 0
        val = min(len(members) - test - 1, max(1, round(val_fraction * len(members))))
        parts["test"].append(members[:test])
        parts["val"].append(members[test:test + val])
        parts["train"].append(members[test + val:])
    return tuple(np.sort(np.concatenate(parts[s])) for s in ("train", "val", "test"))


def library_wordpiece(texts, vocab_size):
    """bert-base-uncased's pipeline, trained by the tokenizers library itself."""
    tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    return tokenizer


def library_bpe(texts, vocab_size):
    """roberta-base's byte-level pipeline, trained by the tokenizers library itself."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def padded(tokenizer, texts, first, last, pad_id, max_length):
    """NumPy: the library's ids of each text without special tokens, cut to max_length - 2, between the first and
    last special ids, then pad_id up to max_length; the mask 1 over the text's ids and its two special ids."""
    ids = np.full((len(texts), max_length), pad_id, np.int64)
    mask = np.zeros((len(texts), max_length), np.int64)
    for row, text in enumerate(texts):
        body = tokenizer.encode(text, add_special_tokens=False).ids[:max_length - 2]
        tokens = [first, *body, last]
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    return ids, mask


def wordpiece_of(vocab):
    """The library's WordPiece model over `vocab`, in bert-base-uncased's pipeline (no trainer involved)."""
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


@pytest.mark.parametrize("model, specials, pad_id", [("wordpiece", ("[CLS]", "[SEP]"), 0),
                                                     ("bpe", ("<s>", "</s>"), 1)])
def test_a_trained_tokenizer_is_the_librarys_on_the_training_rows_alone(tmp_path, model, specials, pad_id):
    """BPE: the library's BpeTrainer on the training rows, token for token. WordPiece: the library's WordPieceTrainer
    numbers its pieces in a random order (tokenizer.py), so its vocabulary is compared where it is determined -- as
    many tokens, the same characters and ## pieces --, every token is a piece of a training word, and the texts are
    encoded as the library's WordPiece model encodes them with that vocabulary. Ids, masks and labels of every split
    against NumPy. Mutations caught: the tokenizer trained on every row (the held-out word is learnt), the split
    not per class or not by the seed (other rows), truncation cutting the end token (the last id differs), padding
    with another id or on the left, the class names unsorted."""
    path = tmp_path / "reviews.csv"
    texts, labels = write_texts(path, held_out_word="zyzzyva")
    data = TextData(path, tokenizer_model=model, vocab_size=600, max_length=9)
    data.prepare()
    train, val, test = expected_split(labels)
    library = {"wordpiece": library_wordpiece, "bpe": library_bpe}[model]
    trained = library([texts[row] for row in train], 600)
    vocab = data.tokenizer.get_vocab()
    assert not any("zz" in token for token in vocab)
    assert any("zz" in token for token in library(texts, 600).get_vocab())  # every row would teach it
    if model == "bpe":
        assert vocab == trained.get_vocab()
        reference = trained
    else:
        assert len(vocab) == trained.get_vocab_size() == data.vocab_size
        assert {t for t in vocab if len(t.removeprefix("##")) == 1} == {
            t for t in trained.get_vocab() if len(t.removeprefix("##")) == 1}
        words = " ".join(texts[row].lower() for row in train)
        assert all(token.removeprefix("##") in words for token in vocab if not token.startswith("["))
        reference = wordpiece_of(vocab)
    first, last = (vocab[token] for token in specials)
    ids, mask = padded(reference, texts, first, last, pad_id, 9)
    assert data.pad_id == pad_id and data.class_names == sorted(CLASSES)
    index = {name: i for i, name in enumerate(sorted(CLASSES))}
    for name, rows in (("train", train), ("val", val), ("test", test)):
        split_ids, split_labels = data.split_arrays(name)
        assert split_ids.dtype == np.int32 and split_labels.dtype == np.int32
        np.testing.assert_array_equal(split_ids, ids[rows])
        np.testing.assert_array_equal(split_labels, [index[labels[row]] for row in rows])
        np.testing.assert_array_equal(data.attention_mask(split_ids), mask[rows])
    assert (len(train), len(val), len(test)) == (42, 6, 12)  # per class of 20: 4 test, 2 validation
    encoded, encoded_mask = data.encode(texts)
    np.testing.assert_array_equal(encoded, ids)
    np.testing.assert_array_equal(encoded_mask, mask)
    assert (mask.sum(axis=1) == 9).any() and (mask.sum(axis=1) < 9).any()  # cut texts and padded ones


def test_the_split_follows_the_fractions_and_the_seed(tmp_path):
    """The splits against NumPy's arithmetic for 30 seeded draws of (rows, classes, fractions, seed)."""
    generator = random.Random(0)
    for case in range(30):
        count, classes = generator.randint(12, 40), generator.randint(2, 4)
        test_fraction, val_fraction = generator.choice([0, 0.1, 0.25]), generator.choice([0.1, 0.2])
        seed = generator.randint(0, 99)
        labels = [f"c{generator.randrange(classes)}" for _ in range(count)]
        labels[:classes] = [f"c{k}" for k in range(classes)]
        counts = {name: labels.count(name) for name in set(labels)}
        if min(counts.values()) < 3:
            continue
        path = tmp_path / f"t{case}.csv"
        with open(path, "w", newline="") as stream:
            csv.writer(stream).writerows([["text", "label"], *[[f"word{row} text", label] for row, label in
                                                              enumerate(labels)]])
        data = TextData(path, test_fraction=test_fraction, val_fraction=val_fraction, split_seed=seed,
                        max_length=4)
        data.prepare()
        expected = expected_split(labels, test_fraction, val_fraction, seed)
        index = {name: i for i, name in enumerate(sorted(set(labels)))}
        for name, rows in zip(("train", "val", "test"), expected):
            np.testing.assert_array_equal(data.split_arrays(name)[1], [index[labels[row]] for row in rows])
        assert data.has_test_set == bool(test_fraction)


def write_tokenizer(folder):
    """A WordPiece tokenizer made with the library from a vocabulary, with no padding set and '<p>' as its pad."""
    vocab = {token: i for i, token in enumerate(["<u>", "<p>", "<c>", "<e>", *WORDS, "##s", "##ing"])}
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="<u>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    from tokenizers import processors

    tokenizer.post_processor = processors.TemplateProcessing(single="<c> $A <e>", special_tokens=[("<c>", 2),
                                                                                                  ("<e>", 3)])
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def test_a_users_tokenizer_file_or_transformers_folder_is_used_as_it_is(tmp_path):
    """A tokenizer.json with data.pad_token, and a folder whose tokenizer_config.json names the pad token as
    transformers writes it ({"content": ...}): the ids are the library's own, the pad id the config's token's.
    Mutation caught: the folder's config not read (no pad token: refused)."""
    path = tmp_path / "reviews.csv"
    texts, _ = write_texts(path, count=30)
    tokenizer = write_tokenizer(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(
        {"pad_token": {"content": "<p>", "lstrip": False}, "model_max_length": 512}))
    expected_ids, expected_mask = padded(tokenizer, texts, 2, 3, 1, 12)
    for given, pad_token in ((tmp_path / "tok", None), (tmp_path / "tok" / "tokenizer.json", "<p>")):
        data = TextData(path, tokenizer=str(given), pad_token=pad_token, max_length=12)
        data.prepare()
        assert (data.pad_id, data.pad_token, data.vocab_size) == (1, "<p>", tokenizer.get_vocab_size())
        ids, mask = data.encode(texts)
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_array_equal(mask, expected_mask)
    with pytest.raises(ConfigError, match=r"the tokenizer names no pad token and holds none of \[PAD\], <pad>"):
        TextData(path, tokenizer=str(tmp_path / "tok" / "tokenizer.json")).prepare()


def test_the_state_carries_the_tokenizer_and_predictions_read_raw_text_without_the_csv(tmp_path):
    """A fresh module given the stored state (as JSON) encodes as the trained one, with the csv gone: sentences,
    a .txt file's lines (numbered from 1, blank ones skipped), a table's rows; a row without text and a missing
    file are one line each. Mutation caught: the state without the tokenizer (prepare() reads the deleted csv)."""
    path = tmp_path / "reviews.csv"
    write_texts(path)
    trained = TextData(path, max_length=10)
    trained.prepare()
    state = json.loads(json.dumps(trained.state_dict()))
    path.unlink()
    library = tokenizers.Tokenizer.from_str(json.dumps(state["tokenizer"]))  # what data_state.json holds
    fresh = TextData(path, max_length=10)
    fresh.load_state_dict(state)
    (tmp_path / "new.txt").write_text("the plot was good\n\n  awful acting  \n")
    with open(tmp_path / "new.csv", "w", newline="") as stream:
        csv.writer(stream).writerows([["text"], ["lovely film"], [""]])
    sentence = "a very funny story " * 20  # longer than max_length, and than a file name may be
    got = list(fresh.predict_samples([sentence, str(tmp_path / "new.txt"), str(tmp_path / "new.csv"),
                                      str(tmp_path / "gone.txt")]))
    expected_texts = [sentence, "the plot was good", "awful acting", "lovely film"]
    ids, _ = padded(library, expected_texts, library.token_to_id("[CLS]"), library.token_to_id("[SEP]"), 0, 10)
    assert [g[0] for g in got] == [sentence, f"{tmp_path / 'new.txt'}:1", f"{tmp_path / 'new.txt'}:3",
                                   f"{tmp_path / 'new.csv'}:0", f"{tmp_path / 'new.csv'}:1", str(tmp_path / "gone.txt")]
    np.testing.assert_array_equal(np.stack([g[1] for g in got[:4]]), ids)
    assert got[4][1:] == (None, f"{tmp_path / 'new.csv'}: column 'text' has no text in row 1")
    assert got[5][1:] == (None, f"{tmp_path / 'gone.txt'} does not exist")


@pytest.mark.parametrize("model, vocab_size", [("wordpiece", 60), ("bpe", 280)])
def test_the_same_texts_train_the_same_tokenizer_for_an_exact_resume(tmp_path, model, vocab_size):
    """A resumed run prepares the data again: the tokenizer and every array must come out the same. Mutation
    caught: WordPiece trained by the library's WordPieceTrainer (its ## pieces numbered in a hash map's order)."""
    path = tmp_path / "reviews.csv"
    write_texts(path, count=90, seed=3)
    first, second = (TextData(path, tokenizer_model=model, vocab_size=vocab_size) for _ in range(2))
    first.prepare()
    second.prepare()
    assert first.state_dict() == second.state_dict()
    for name in ("train", "val", "test"):
        for a, b in zip(first.split_arrays(name), second.split_arrays(name)):
            np.testing.assert_array_equal(a, b)


def test_a_sentence_is_told_from_a_file_without_touching_the_disk_for_long_text(tmp_path):
    assert not _names_a_file("a fine film")
    assert not _names_a_file("x" * 5000)  # os.path: no ENAMETOOLONG raised
    assert _names_a_file("missing.txt") and _names_a_file(str(tmp_path))
    assert not _names_a_file("see notes.txt")  # two words: a sentence


def _fifo(path):
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("arguments, error, message", [
    ({"path": "t.xlsx"}, ConfigError, "path must be a .csv or .parquet file; got 't.xlsx'"),
    ({"text": "review"}, ConfigError, "data.text=review is not a column of {csv}: its columns are text, label"),
    ({"target": "stars"}, ConfigError, "data.target=stars is not a column of {csv}: its columns are text, label"),
    ({"target": "text"}, ConfigError, "text and target name the same column ('text')"),
    ({"tokenizer_model": "unigram"}, ConfigError, "tokenizer_model must be one of wordpiece, bpe; got 'unigram'"),
    ({"tokenizer_model": "bpe", "vocab_size": 100}, ConfigError, "vocab_size must be"),
    ({"max_length": 2}, ConfigError, "data.max_length=2 leaves no room for a text: the tokenizer adds 2 special "
                                     "tokens to each"),
    ({"max_length": 10 ** 6}, ConfigError, "max_length must be at most 65,536 tokens; got 1000000"),
    ({"tokenizer": "{tmp}/none"}, ConfigError, "data.tokenizer={tmp}/none does not exist"),
    ({"tokenizer": "{tmp}"}, ConfigError, "data.tokenizer={tmp} holds no tokenizer.json: give a tokenizer.json"),
    ({"tokenizer": "{tmp}/garbage.json"}, ConfigError, "data.tokenizer={tmp}/garbage.json: garbage.json cannot be "
                                                       "read as a tokenizer of the tokenizers library ("),
    ({"tokenizer": "{tmp}/pipe.json"}, ConfigError, "data.tokenizer={tmp}/pipe.json is a FIFO (named pipe), not a "
                                                    "regular file"),
    ({"pad_token": "<nope>", "tokenizer": "{tmp}/tok"}, ConfigError, "data.pad_token=<nope> is not a token of the "
                                                                     "tokenizer"),
])
def test_bad_keys_and_files_are_one_line_naming_them(tmp_path, arguments, error, message):
    csv_path = tmp_path / "t.csv"
    write_texts(csv_path, count=30)
    (tmp_path / "garbage.json").write_text("{not json")
    _fifo(tmp_path / "pipe.json")
    write_tokenizer(tmp_path / "tok")
    arguments = {key: value.format(tmp=tmp_path) if isinstance(value, str) else value
                 for key, value in arguments.items()}
    with pytest.raises(error) as raised:
        TextData(**{"path": csv_path, **arguments}).prepare()
    assert message.format(csv=csv_path, tmp=tmp_path) in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("rows, message", [
    ([["a film", "pos"], ["", "neg"], ["a plot", "neg"]], "{csv}: column 'text' has no text in row 1: give every row "
                                                          "a text, or remove the row"),
    ([["a film", "pos"], ["a plot", "NA"], ["a plot", "neg"]], "{csv}: column 'label' (the labels) has no value in "
                                                               "row 1 ('NA')"),
    ([["a film", "pos"], ["a plot", "pos"]], "{csv}: column 'label' holds a single class ('pos')"),
])
def test_bad_rows_are_one_line_naming_column_and_row(tmp_path, rows, message):
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as stream:
        csv.writer(stream).writerows([["text", "label"], *rows])
    with pytest.raises(DataError) as raised:
        TextData(path).prepare()
    assert message.format(csv=path) in str(raised.value) and "\n" not in str(raised.value)


def test_numeric_labels_are_classes_named_as_written_and_sorted_by_value(tmp_path):
    path = tmp_path / "t.csv"
    labels = ["10", "2", "2.0", "1"] * 5
    with open(path, "w", newline="") as stream:
        csv.writer(stream).writerows([["text", "label"], *[[f"text {i}", label] for i, label in enumerate(labels)]])
    data = TextData(path, max_length=6)
    data.prepare()
    assert data.class_names == ["1", "2", "10"]  # 2 and 2.0: one class, as data=table names them


def test_a_short_run_trains_then_predicts_raw_text_with_the_csv_deleted(graph_mode, tmp_path):
    """recipe=text_classification on 60 rows, two epochs of batches of 8 (about 15 s on a busy 2-core machine: a
    training graph, an evaluation graph and predict's, compiled); the run keeps the tokenizer
    (data_state.json), so predict, given sentences and a .txt file after the csv is deleted, writes one row each,
    whose probabilities are the softmax of the trained network's logits on the stored tokenizer's ids (NumPy).
    Mutation caught: the state without the tokenizer (predict stops: the csv is gone)."""
    import mindspore as ms

    from trainkit.app import train
    from trainkit.app.config import compose_config
    from trainkit.tools.inference import eager, load_trained
    from trainkit.tools.predict import main

    path = tmp_path / "reviews.csv"
    write_texts(path)
    run = tmp_path / "run"
    result = train(compose_config(["recipe=text_classification", f"data.path={path}", "data.max_length=12",
                                   "data.batch_size=8", "trainer.epochs=2", "logger=quiet", f"run_dir={run}"]))
    assert result.metrics["optimizer_steps"] == 2 * (42 // 8)
    assert json.loads((run / "class_names.json").read_text()) == sorted(CLASSES)
    state = json.loads((run / "data_state.json").read_text())
    path.unlink()
    (tmp_path / "more.txt").write_text("a lovely story\nthe ending was awful\n")
    sentences = ["very funny and warm", "boring, cold plot"]
    out = tmp_path / "predictions.csv"
    assert main([str(run), *sentences, str(tmp_path / "more.txt"), "--out", str(out), "--top-k", "3"]) == 0
    with open(out, newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0][:3] == ["input", "prediction", "probability"]
    assert [row[0] for row in rows[1:]] == [*sentences, f"{tmp_path / 'more.txt'}:1", f"{tmp_path / 'more.txt'}:2"]
    library = tokenizers.Tokenizer.from_str(json.dumps(state["tokenizer"]))
    texts = [*sentences, "a lovely story", "the ending was awful"]
    ids, _ = padded(library, texts, library.token_to_id("[CLS]"), library.token_to_id("[SEP]"), 0, 12)
    with eager():  # op by op: no second graph to compile for four rows
        logits = load_trained(run).network(ms.Tensor(ids.astype(np.int32))).asnumpy().astype(np.float64)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    for row, chances in zip(rows[1:], probabilities):
        assert row[1] == sorted(CLASSES)[int(np.argmax(chances))]
        assert float(row[2]) == pytest.approx(chances.max(), abs=1e-6)


def test_text_bag_averages_the_embeddings_of_the_unpadded_tokens(mode):
    """TextBag's logits against NumPy: the mean of the embedding rows of the ids that are not pad_id, through
    Dense, ReLU, Dense with the network's own parameters; a text of padding alone gives the head's output on zeros.
    Mutation caught: the pad positions averaged in (the padded rows differ)."""
    import mindspore as ms

    from trainkit.models.text import TextBag

    ms.set_seed(0)
    network = TextBag(vocab_size=30, num_classes=3, pad_id=2, embed_dim=5, hidden_sizes=[4])
    network.set_train(False)
    ids = np.random.default_rng(0).integers(0, 30, (4, 7)).astype(np.int32)
    ids[ids == 2] = 3
    ids[1, 4:] = 2
    ids[2, :] = 2
    table = network.embedding.embedding_table.asnumpy()
    np.testing.assert_allclose(table[2], 0)  # the pad row starts at zero, as PyTorch's padding_idx
    table[2] = 5.0  # a table from a checkpoint may hold anything there: the mask, not the row, leaves it out
    network.embedding.embedding_table.set_data(ms.Tensor(table))
    (w1, b1), (w2, b2) = [(layer.weight.asnumpy(), layer.bias.asnumpy()) for layer in
                          (network.head[0], network.head[2])]
    mask = (ids != 2).astype(np.float64)
    mean = (table[ids] * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
    expected = np.maximum(mean @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(network(ms.Tensor(ids)).asnumpy(), expected, rtol=1e-5, atol=1e-6)


def test_the_default_recipes_small_cnn_on_texts_names_the_text_model(tmp_path):
    """python -m trainkit data=text (the quick start's small CNN left in place) stops in one line saying which model
    trains on texts. Mutation caught: the hint left out."""
    from trainkit.app.build import build_model
    from trainkit.app.config import compose_config

    cfg = compose_config(["data=text", f"data.path={tmp_path / 't.csv'}", f"run_dir={tmp_path}"])
    with pytest.raises(ConfigError) as raised:
        build_model(cfg, TextData(tmp_path / "t.csv"))
    assert str(raised.value).startswith("model.")
    assert str(raised.value).endswith("(TextData trains with model=text_bag, or recipe=text_classification)")


@pytest.mark.parametrize("override, message", [
    ("data.max_length=0", "data.max_length must be an int >= 1; got 0"),
    ("data.tokenizer_model=sentencepiece", "data.tokenizer_model must be one of wordpiece, bpe; got 'sentencepiece'"),
    ("data.tokenizer={tmp}/tokenizer.json", "data.tokenizer={tmp}/tokenizer.json does not exist"),
    ("data.target=stars", "data.target=stars is not a column of {tmp}/t.csv: its columns are text, label"),
])
def test_the_command_stops_in_one_line_naming_the_key(tmp_path, monkeypatch, override, message):
    """python -m trainkit recipe=text_classification with a bad data key: exit status 2, one line on stderr, no run
    directory written."""
    from tests.common.transcripts import run_in_process

    write_texts(tmp_path / "t.csv", count=30)
    monkeypatch.chdir(tmp_path)
    printed = run_in_process(["python", "-m", "trainkit", "recipe=text_classification", f"data.path={tmp_path}/t.csv",
                              override.format(tmp=tmp_path), f"hydra.run.dir={tmp_path / 'run'}"])
    assert printed.status == 2 and printed.stderr.count("\n") == 1, printed.stderr
    assert printed.stderr.startswith("trainkit: error: ") and message.format(tmp=tmp_path) in printed.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_parquet_file_reads_as_the_csv_does(tmp_path):
    """Texts and whole-number labels from Parquet: the same classes and ids as the same rows in a CSV; a null text
    is one line naming the row."""
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts, labels = write_texts(tmp_path / "t.csv", count=30)
    numbers = [{"neg": 2, "pos": 10, "meh": 1}[label] for label in labels]
    pq.write_table(pyarrow.table({"text": texts, "label": numbers}), tmp_path / "t.parquet")
    with open(tmp_path / "n.csv", "w", newline="") as stream:
        csv.writer(stream).writerows([["text", "label"], *zip(texts, numbers)])
    from_parquet, from_csv = TextData(tmp_path / "t.parquet", max_length=8), TextData(tmp_path / "n.csv", max_length=8)
    from_parquet.prepare()
    from_csv.prepare()
    assert from_parquet.class_names == from_csv.class_names == ["1", "2", "10"]
    for name in ("train", "val", "test"):
        for a, b in zip(from_parquet.split_arrays(name), from_csv.split_arrays(name)):
            np.testing.assert_array_equal(a, b)
    pq.write_table(pyarrow.table({"text": [*texts[:3], None], "label": [1, 2, 1, 2]}), tmp_path / "gap.parquet")
    with pytest.raises(DataError, match=r"gap.parquet: column 'text' has no text in row 3"):
        TextData(tmp_path / "gap.parquet").prepare()
