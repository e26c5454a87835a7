"""trainkit.rundir.output_file: an output is replaced whole or not at all, and a full disk names the output."""
import errno
import os

import pytest

from trainkit.rundir.output_file import write_text_whole, written_whole


def _full_disk(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a flush's error: it names no file


def test_a_finished_write_replaces_the_output_and_leaves_no_temporary_file(tmp_path):
    output = tmp_path / "out" / "table.csv"
    write_text_whole(output, "first")
    write_text_whole(output, "second")
    assert output.read_text() == "second"
    assert sorted(p.name for p in output.parent.iterdir()) == ["table.csv"]


@pytest.mark.parametrize("failure", [ValueError("the content's code failed"),
                                     OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))])
def test_a_failed_write_leaves_the_previous_output_and_nothing_else(tmp_path, failure):
    output = tmp_path / "table.csv"
    output.write_text("previous")
    with pytest.raises(type(failure)), written_whole(output) as temporary:
        temporary.write_text("half of the new")
        raise failure
    assert output.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_a_full_disk_names_the_output_not_the_temporary_name(tmp_path):
    output = tmp_path / "model.mindir"
    with pytest.raises(OSError) as raised, written_whole(output, ".mindir") as temporary:
        assert temporary.name == f".model.mindir.{os.getpid()}.tmp.mindir"
        temporary.write_bytes(b"partial")
        _full_disk()
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(output)
    assert list(tmp_path.iterdir()) == []


def test_a_block_that_writes_nothing_leaves_the_output_alone(tmp_path):
    output = tmp_path / "predictions.csv"
    output.write_text("previous")
    with written_whole(output) as temporary:
        temporary.write_text("header only")
        temporary.unlink()
    assert output.read_text() == "previous" and [p.name for p in tmp_path.iterdir()] == ["predictions.csv"]


def test_safetensors_on_a_full_disk_is_the_os_error_naming_the_output(tmp_path, monkeypatch):
    """safetensors raises its own error class for an I/O error, the OS error only in its message: said as the
    OSError, so that the command's one line names the file; nothing is left. Mutation caught: the error passed on
    as it is (a traceback)."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import numpy as np

    from trainkit.bridge.export_torch import write_torch

    class SafetensorError(Exception):
        pass

    def full_disk(tensors, filename):
        with open(filename, "wb") as stream:
            stream.write(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors_numpy, "save_file", full_disk)
    output = tmp_path / "model.safetensors"
    with pytest.raises(OSError) as raised:
        write_torch({"w": np.zeros(2, np.float32)}, output)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(output)
    assert list(tmp_path.iterdir()) == []

    def other(tensors, filename):
        raise SafetensorError("invalid tensor name")

    monkeypatch.setattr(safetensors_numpy, "save_file", other)
    with pytest.raises(SafetensorError):
        write_torch({"w": np.zeros(2, np.float32)}, output)


def test_a_link_planted_under_the_temporary_name_is_not_written_through(tmp_path):
    """The temporary name is predictable (pid): a symbolic link someone planted there is removed, not followed, so
    the file it points to keeps its bytes. Mutation caught: without the unlink, the victim's bytes were replaced."""
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's")
    output = tmp_path / "out" / "table.csv"
    output.parent.mkdir()
    (output.parent / f".table.csv.{os.getpid()}.tmp").symlink_to(victim)
    write_text_whole(output, "rows")
    assert victim.read_text() == "someone else's" and output.read_text() == "rows"
    assert sorted(p.name for p in output.parent.iterdir()) == ["table.csv"]
