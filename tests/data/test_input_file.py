"""Every input is opened through trainkit.data.input_file: anything but a regular file is refused in one line naming
it and what it is, and never hangs; an image past Pillow's pixel bound and a table past 10,000 columns are refused
in one line before they are decoded or parsed.

No test here has a timer: a FIFO's write end is opened nowhere, so a reader that blocked on it would hang the test
run, and each test ends because nothing blocks (O_NONBLOCK; the kind refused before the open)."""
import os
import random
import socket
import stat
import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.common.image_folders import write_folder, write_image
from tests.common.transcripts import run_in_process
from trainkit.bridge.name_mapping import load_rules
from trainkit.bridge.state_dict import read_state_dict
from trainkit.data import input_file
from trainkit.data.image_folder import ImageFolderData
from trainkit.data.input_file import open_input, read_input
from trainkit.data.predict_inputs import image_samples, read_image, table_samples
from trainkit.data.table import TableData
from trainkit.data.table_file import read_table
from trainkit.errors import CheckpointError, ConfigError, DataError
from trainkit.rundir.checkpoint_file import read_resumable_checkpoint
from trainkit.rundir.weights import network_weights

# ------------------------------------------------------------------------------------ what is not a regular file
# kind -> (make it at a path, the words the refusal must hold); written without trainkit's own helpers


def _fifo(path):
    os.mkfifo(path)


def _socket(path):
    # a Unix socket's path is limited to about 108 bytes: bind by a short relative name from its folder
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path.name)  # the socket file stays after the close
    finally:
        os.chdir(here)


KINDS = {
    "fifo": (_fifo, "is a FIFO (named pipe), not a regular file"),
    "socket": (_socket, "is a socket, not a regular file"),
    "link_to_dev_zero": (lambda path: path.symlink_to("/dev/zero"), "(a link to /dev/zero) is a character device"),
    "folder": (lambda path: path.mkdir(), "is a folder, not a regular file"),
    "link_to_dev_null": (lambda path: path.symlink_to("/dev/null"), "(a link to /dev/null) is a character device"),
}


def _image_folder(root: Path, entry_name: str) -> Path:
    write_folder(root, {"cat": 2, "dog": 2}, size=(8, 8))
    return root / "dog" / entry_name


# reader -> (suffixes its inputs take, read(path, tmp_path) -> the one-line refusal it gives)
def _read_image_folder(path, tmp_path):
    with pytest.raises(DataError) as refused:
        ImageFolderData(path.parent.parent, image_size=8, batch_size=2).prepare()
    return str(refused.value)


def _read_table(path, tmp_path):
    with pytest.raises(DataError) as refused:
        TableData(path, target="kind").prepare()
    return str(refused.value)


def _predict(path, tmp_path):
    if path.suffix.lower() in (".csv", ".npy", ".npz"):
        got = list(table_samples([str(path)], lambda row: row, (2,), "a row"))
    elif path.suffix.lower() == ".png":
        got = list(image_samples([str(path)], lambda image: image, 3))
    else:
        got = list(ImageFolderData(tmp_path, image_size=8).predict_samples([str(path)]))
    assert len(got) == 1 and got[0][0] == str(path) and got[0][1] is None, got
    return got[0][2]


def _weights(path, tmp_path):
    with pytest.raises(CheckpointError) as refused:
        if path.suffix == ".ckpt":
            network_weights(path)
        else:
            read_state_dict(path)
    return str(refused.value)


def _checkpoint(path, tmp_path):
    with pytest.raises(CheckpointError) as refused:
        read_resumable_checkpoint(path)  # through load_checkpoint_file, as every checkpoint read
    return str(refused.value)


def _mapping_file(path, tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_rules(path)
    return str(refused.value)


READERS = {
    "image_folder": ((".jpg", ".JPG", ".png", ".jpeg"), _read_image_folder),
    "table_csv": ((".csv", ".CSV"), _read_table),
    "predict_input": ((".csv", ".npy", ".npz", ".png", ".jpg"), _predict),
    "weights_file": ((".safetensors", ".pth", ".ckpt"), _weights),
    "checkpoint": ((".ckpt",), _checkpoint),
    "mapping_file": ((".yaml", ".yml"), _mapping_file),  # convert's and compare's --mapping
}


def _cases(per_pair: int = 4):
    """Every kind with every reader, `per_pair` times, each time a name drawn from Random(0): letters, digits,
    spaces, a dot, a hyphen or a non-ASCII letter, and one of the reader's suffixes."""
    rng = random.Random(0)
    letters = "abcdefgh xyz-._0123456789éß"
    cases = []
    for kind in KINDS:
        for reader, (suffixes, _) in READERS.items():
            for _ in range(per_pair):
                stem = "".join(rng.choice(letters) for _ in range(rng.randint(1, 12))).strip(" .") or "x"
                cases.append((kind, reader, stem + rng.choice(suffixes)))
    return cases


CASES = _cases()


@pytest.mark.parametrize("kind, reader, name", CASES, ids=[f"{k}-{r}-{i}" for i, (k, r, _) in enumerate(CASES)])
def test_what_is_not_a_regular_file_is_refused_in_one_line_naming_it(kind, reader, name, tmp_path):
    """A FIFO, a socket, a link to /dev/zero or /dev/null and a folder, under a name each reader takes, through the
    image folder, a table, predict's inputs, the weights, the checkpoint and the mapping-file readers: one line
    naming the path and what it is. Mutations caught: image_files keeping regular files only (the FIFO is left
    out of the check, which ImageFolderDataset then blocks on: here nothing is refused, red); input_file without
    its kind checks (MindSpore's load_checkpoint blocks on the FIFO: the test run never ends, red)."""
    make, words = KINDS[kind]
    if kind == "folder" and reader == "predict_input" and Path(name).suffix.lower() in (".png", ".jpg"):
        words = "holds no image files"  # predict reads a folder's images: this one has none
    path = _image_folder(tmp_path / "images", name) if reader == "image_folder" else tmp_path / name
    make(path)
    message = READERS[reader][1](path, tmp_path)
    assert "\n" not in message, message
    assert f"{path}" in message and words in message, message


def test_a_fifo_put_in_place_between_the_check_and_the_open_cannot_block_the_open(tmp_path, monkeypatch):
    """The stat says "a regular file" (a file swapped for a FIFO right after): the open does not wait for a writer
    (O_NONBLOCK) and fstat on the open descriptor refuses it. Mutation caught: os.open without O_NONBLOCK blocks
    forever here (no writer is ever opened)."""
    regular, fifo = tmp_path / "regular.csv", tmp_path / "pipe.csv"
    regular.write_text("a,b\n1,2\n")
    os.mkfifo(fifo)
    real_stat = os.stat

    def stale_stat(path, *args, **kwargs):  # what a stat before the swap saw
        return real_stat(regular if Path(path) == fifo else path, *args, **kwargs)

    monkeypatch.setattr(input_file.os, "stat", stale_stat)
    with pytest.raises(DataError) as refused:
        read_input(fifo)
    monkeypatch.undo()
    assert str(refused.value).startswith(f"{fifo} is a FIFO (named pipe), not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO: nothing wrote to it or replaced it


def test_a_regular_file_and_a_link_to_one_read_whole_or_bounded(tmp_path):
    """What is read is the file's bytes; a bound refuses a longer file and reads no more than bound + 1 bytes."""
    rng = random.Random(0)
    data = bytes(rng.randrange(256) for _ in range(5000))
    (tmp_path / "file.bin").write_bytes(data)
    (tmp_path / "link.bin").symlink_to(tmp_path / "file.bin")
    for name in ("file.bin", "link.bin"):
        assert read_input(tmp_path / name) == data
        with open_input(tmp_path / name) as stream:
            assert stream.seekable() and stream.read(10) == data[:10]
    for _ in range(50):
        limit = rng.randrange(0, 10000)
        if limit >= len(data):
            assert read_input(tmp_path / "file.bin", limit=limit) == data
        else:
            with pytest.raises(DataError, match=f"is longer than {limit:,} bytes"):
                read_input(tmp_path / "file.bin", limit=limit)
    with pytest.raises(DataError, match=r"does not exist \(a link to .*gone.bin, which does not\)"):
        (tmp_path / "dangling.bin").symlink_to(tmp_path / "gone.bin")
        read_input(tmp_path / "dangling.bin")


def test_the_command_refuses_a_fifo_in_an_image_folder_in_one_line(tmp_path, monkeypatch):
    """The reported hang: `pipe.jpg` a FIFO in a class folder passed the check (regular files only) and
    ImageFolderDataset blocked on it. Now one line, exit status 2, nothing written."""
    root = write_folder(tmp_path / "images", {"cat": 3, "dog": 3}, size=(8, 8))
    os.mkfifo(root / "dog" / "pipe.jpg")
    monkeypatch.chdir(tmp_path)
    printed = run_in_process(["python", "-m", "trainkit", "data=image_folder", f"data.root={root}",
                              "data.image_size=8", f"hydra.run.dir={tmp_path / 'run'}"])
    assert printed.status == 2, printed.stderr
    assert printed.stderr == (f"trainkit: error: {root / 'dog' / 'pipe.jpg'} is a FIFO (named pipe), not a regular "
                              "file: trainkit reads inputs from regular files only\n")
    assert not (tmp_path / "run" / ".hydra").exists()


# --------------------------------------------------------------------------------------------- decompression bombs
def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height RGB pixels and holds none (a few dozen bytes), written by hand."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_a_png_claiming_20000_by_20000_pixels_is_one_line_before_decoding(tmp_path, monkeypatch):
    """The reported crash: a 20000x20000 PNG of a few bytes was a 45-line traceback (Pillow's
    DecompressionBombError). Now one line naming the file and the counts, through the command and predict.
    Mutation caught: DecompressionBombError not caught in opened_image (a traceback, red)."""
    root = write_folder(tmp_path / "images", {"cat": 3, "dog": 3}, size=(8, 8))
    bomb = root / "cat" / "bomb.png"
    bomb.write_bytes(_png_header(20000, 20000))
    assert bomb.stat().st_size < 100
    monkeypatch.chdir(tmp_path)
    printed = run_in_process(["python", "-m", "trainkit", "data=image_folder", f"data.root={root}",
                              "data.image_size=8", f"hydra.run.dir={tmp_path / 'run'}"])
    assert printed.status == 2, printed.stderr
    assert printed.stderr.count("\n") == 1, printed.stderr
    from PIL import Image
    assert f"{bomb} has {20000 * 20000:,} pixels, more than the {Image.MAX_IMAGE_PIXELS:,}" in printed.stderr
    got = list(image_samples([str(bomb)], lambda image: image, 3))
    assert got[0][1] is None and got[0][2].startswith(f"{bomb} has {20000 * 20000:,} pixels"), got


def test_an_image_is_refused_exactly_when_its_pixels_pass_the_bound(tmp_path, monkeypatch):
    """Real PNGs (made by Pillow, up to 40x40) against a bound lowered with monkeypatch, drawn from Random(0):
    refused iff width * height > bound, by the check and by predict, in one line with the counts; Pillow's own
    warning (bound < pixels <= 2 * bound) or error (beyond) never shows. Mutation caught: opened_image without its
    size check (an image between the bound and twice it is decoded: red)."""
    from PIL import Image

    from trainkit.data.image_check import check_image

    rng, np_rng = random.Random(0), np.random.default_rng(0)
    for case in range(120):
        width, height = rng.randint(1, 40), rng.randint(1, 40)
        bound = rng.randint(1, 2000)
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", bound)
        path = write_image(tmp_path / f"{case}.png", np_rng, size=(height, width))
        if width * height <= bound:
            assert check_image(path) == 3
            assert read_image(path, 3).shape == (height, width, 3)
            continue
        with pytest.raises(DataError) as refused:
            check_image(path)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{path} has {width * height:,} pixels") and \
            f"more than the {bound:,} trainkit decodes" in message, message
        with pytest.raises(DataError):
            read_image(path, 3)


def test_pillows_bomb_warning_never_adds_a_second_line(tmp_path, monkeypatch):
    """An image between the bound and twice it: Pillow warns as it opens it; the command prints trainkit's line
    alone, and no warning is issued even where every warning is shown. Mutation caught: the warning filter not
    added (a DecompressionBombWarning recorded: red)."""
    from PIL import Image

    from trainkit.data.image_check import check_image

    root = write_folder(tmp_path / "images", {"cat": 3, "dog": 3}, size=(8, 8))
    write_image(root / "dog" / "big.png", np.random.default_rng(0), size=(30, 40))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1200 pixels: past the bound, within twice it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DataError):
            check_image(root / "dog" / "big.png")
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)], caught
    monkeypatch.chdir(tmp_path)
    printed = run_in_process(["python", "-m", "trainkit", "data=image_folder", f"data.root={root}",
                              "data.image_size=8", f"hydra.run.dir={tmp_path / 'run'}"])
    assert printed.status == 2, printed.stderr
    assert printed.stderr == (f"trainkit: error: {root / 'dog' / 'big.png'} has 1,200 pixels (40x30), more than the "
                              "1,000 trainkit decodes (PIL.Image.MAX_IMAGE_PIXELS; a decompression bomb?): resize it, "
                              "or remove it\n")


# ------------------------------------------------------------------------------------------------- wide tables
def test_a_million_column_header_is_refused_in_one_line_at_once(tmp_path, monkeypatch):
    """The reported stall: a CSV whose header names 1,000,000 columns gave no answer within 120 s. Now one line
    naming the file, a count and the bound, read from the header's first MiB alone. Mutation caught: the header
    read unbounded and parsed before its columns are counted (the command runs for minutes: red by its time)."""
    path = tmp_path / "wide.csv"
    with open(path, "w") as stream:
        stream.write(",".join(f"c{i}" for i in range(1_000_000)) + ",kind\n")
        stream.write(",".join("1" for _ in range(1_000_001)) + "\n")
    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    printed = run_in_process(["python", "-m", "trainkit", "data=table", f"data.path={path}", "data.target=kind",
                              "model=mlp", f"hydra.run.dir={tmp_path / 'run'}"])
    took = time.perf_counter() - started
    assert printed.status == 2 and printed.stderr.count("\n") == 1, printed.stderr
    # the first 1,048,576 characters of the header, counted here: each column name and its comma
    text = ",".join(f"c{i}" for i in range(1_000_000))[:1 << 20]
    assert f"{path} has at least {text.count(',') + 1:,} columns (in the first 1,048,576 characters of its header)" \
        f"; a table may have at most 10,000" in printed.stderr, printed.stderr
    assert took < 20, f"{took:.1f} s"  # about 0.03 s for the read; the rest is composing the config


def test_a_table_is_refused_exactly_past_10000_columns(tmp_path):
    """Column counts drawn from Random(0) around the bound (and one far past it within the line bound): refused iff
    more than 10,000, naming the exact count; a header longer than the line bound but of few columns is refused
    as a long line. Mutation caught: the count compared with >= (10,000 columns refused: red)."""
    rng = random.Random(0)
    for case in range(24):
        columns = rng.choice([1, 2, 9_999, 10_000, 10_001, 10_002, rng.randint(2, 12_000), 100_000])
        path = tmp_path / f"{case}.csv"
        path.write_text(",".join(f"{i}" for i in range(columns)) + "\n" + ",".join("1" for _ in range(columns)) + "\n")
        if columns <= 10_000:
            assert len(read_table(path).columns) == columns
        else:
            with pytest.raises(DataError) as refused:
                read_table(path)
            assert str(refused.value) == (f"{path} has {columns:,} columns; a table may have at most 10,000: keep the "
                                          "columns you need in a file of their own")
    long_names = tmp_path / "long.csv"
    long_names.write_text(",".join("n" * 200_000 + str(i) for i in range(6)) + "\n" + "1," * 5 + "1\n")
    with pytest.raises(DataError, match=r"long.csv: line 1 is longer than 1,048,576 characters"):
        read_table(long_names)


def test_a_parquet_file_past_10000_columns_is_refused_from_its_footer(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({f"c{i}": [1.0] for i in range(10_001)}), path)
    with pytest.raises(DataError) as refused:
        read_table(path)
    assert str(refused.value).startswith(f"{path} has 10,001 columns; a table may have at most 10,000")
