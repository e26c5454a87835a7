"""python -m trainkit.export RUN model.mindir|model.onnx: the files' outputs agree with the network's logits."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.common.trained_digits import network_logits, val_digits
from trainkit.export import main

onnxruntime = pytest.importorskip("onnxruntime")


def test_mindir_and_onnx_agree_with_the_networks_logits(digits_run, tmp_path, capsys):
    """The run trained with the default conv_impl (unfold or channel_major on CPU); the files hold the native one.

    Mutations caught: the ONNX input shape taken as (batch_size, 8, 8) instead of the data's (1, 8, 8) (onnxruntime
    refuses the eval images); --weights-of ema exporting the live weights."""
    _, images = val_digits(12)
    assert main([str(digits_run), str(tmp_path / "model.mindir")]) == 0
    assert main([str(digits_run), str(tmp_path / "model.onnx"), "--batch-size", "4"]) == 0
    assert main([str(digits_run), str(tmp_path / "ema.onnx"), "--batch-size", "4", "--weights-of", "ema"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert "input Nx1x8x8, conv_impl native (trained with auto)" in said[0], said
    assert "input 4x1x8x8, conv_impl native" in said[1], said
    live, ema = network_logits(digits_run, images), network_logits(digits_run, images, "ema")
    tolerance = 1e-4 * max(1.0, np.abs(live).max())

    graph = nn.GraphCell(ms.load(str(tmp_path / "model.mindir")))
    np.testing.assert_allclose(graph(ms.Tensor(images)).asnumpy(), live, atol=tolerance, rtol=0)
    np.testing.assert_allclose(graph(ms.Tensor(images[:5])).asnumpy(), live[:5], atol=tolerance, rtol=0)  # any batch
    for name, expected in (("model.onnx", live), ("ema.onnx", ema)):
        session = onnxruntime.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
        (feed,) = session.get_inputs()
        assert feed.shape == [4, 1, 8, 8]
        got = np.concatenate([session.run(None, {feed.name: images[i:i + 4]})[0] for i in range(0, 12, 4)])
        np.testing.assert_allclose(got, expected, atol=tolerance, rtol=0)
    assert np.abs(ema - live).max() > 10 * tolerance  # the two are told apart


def test_onnx_is_written_by_mindspore_onnx_export_not_the_deprecated_path(digits_run, tmp_path, monkeypatch):
    """``mindspore.export(file_format='ONNX')`` is deprecated in MindSpore 2.10 and prints so on every export (a
    user's ``python -m trainkit.export run model.onnx`` showed it); the ONNX file comes from ``mindspore.onnx.export``.

    Mutation caught: the ONNX export through ``mindspore.export`` again (refused here)."""
    real = ms.export

    def export(net, *inputs, file_name, file_format, **kwargs):
        assert file_format != "ONNX", "the deprecated mindspore.export(file_format='ONNX') was called"
        return real(net, *inputs, file_name=file_name, file_format=file_format, **kwargs)

    monkeypatch.setattr(ms, "export", export)
    assert main([str(digits_run), str(tmp_path / "model.onnx")]) == 0
    assert main([str(digits_run), str(tmp_path / "model.mindir")]) == 0
    assert {path.name for path in tmp_path.iterdir()} == {"model.onnx", "model.mindir"}


def test_an_operator_the_format_lacks_is_one_line_naming_the_output(digits_run, tmp_path, capsys, monkeypatch):
    """ResNet's padded max pooling has no ONNX counterpart in MindSpore 2.10 (MaxPool3DWithArgmax): the refusal names
    the file asked for, not the temporary name it was being written under, and leaves nothing.

    Mutation caught: the message naming the temporary file (``.model.<pid>.tmp.onnx``)."""
    import mindspore.onnx

    def refuse(*args, **kwargs):
        raise RuntimeError("Can not find key MaxPool3DWithArgmax in convert map.\nmore lines")

    monkeypatch.setattr(mindspore.onnx, "export", refuse)
    output = tmp_path / "model.onnx"
    assert main([str(digits_run), str(output)]) == 2
    err = capsys.readouterr().err
    assert err == (f"trainkit: error: {output}: MindSpore cannot export this network as ONNX (Can not find key "
                   "MaxPool3DWithArgmax in convert map.); nothing was written\n"), err
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_disagrees_is_not_left_behind(digits_run, tmp_path, capsys, monkeypatch):
    """Trainkit's own evaluation moved by 0.5: the check fails, one line says by how much, nothing is left.

    Mutation caught: the comparison left out (the file is renamed into place unchecked)."""
    import trainkit.tools.deploy as deploy

    real = deploy.outputs
    monkeypatch.setattr(deploy, "outputs", lambda network, batch: real(network, batch) + 0.5)
    for name in ("model.mindir", "model.onnx"):
        assert main([str(digits_run), str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"trainkit: error: {tmp_path / name}: the exported model's "
                                                       "outputs differ from trainkit's evaluation by 0.5 ("), err
        assert "nothing was written" in err
    assert list(tmp_path.iterdir()) == []


def test_bad_output_is_one_line_before_any_work(digits_run, tmp_path, capsys):
    """Mutation caught: refuse_existing dropped from check_output (an existing file would be replaced)."""
    (tmp_path / "taken.onnx").write_text("mine")
    (tmp_path / "a_file").write_text("")
    cases = [([str(tmp_path / "taken.onnx")], "taken.onnx already exists: nothing was written"),
             ([str(tmp_path / "a_file" / "m.mindir")], f"{tmp_path}/a_file is a file, not a folder"),
             ([str(tmp_path / "m.onnx"), "--batch-size", "0"], "--batch-size must be at least 1"),
             ([str(tmp_path / "m.onnx"), "data.image_sise=16"], "data.image_sise is not a key of")]
    for argv, message in cases:
        assert main([str(digits_run), *argv]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("trainkit: error: ") and err.count("\n") == 1 and message in err, err
    assert (tmp_path / "taken.onnx").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "taken.onnx"]


class PlainConvNet(nn.Cell):
    """A user's network of MindSpore's own nn.Conv2d, its config without conv_impl (as a ported model's)."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 8 * 8, num_classes)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def test_a_network_whose_config_has_no_conv_impl_exports_with_mindspores_convolutions(tmp_path, capsys, caplog):
    """The app swaps such a network's nn.Conv2d (conv_impl's default, auto); the export used the swapped network
    as it was, whose custom kernels MindSpore cannot write ("The pointer[value] is null"). Mutation tried:
    deploy's default for a missing conv_impl back to None (native): red, the export fails."""
    from trainkit.app import train
    from trainkit.app.config import compose_config

    caplog.set_level("INFO", logger="trainkit")
    run = tmp_path / "run"
    train(compose_config([f"run_dir={run}", "logger.progress=off", "logger.tensorboard=false", "trainer.epochs=1",
                          "trainer.test=false", f"model._target_={__name__}.PlainConvNet", "~model.width",
                          "~model.num_downsamples", "~model.stem_stride", "~model.conv_impl"]))
    assert "1 nn.Conv2d run as trainkit's im2col convolution" in caplog.text
    assert main([str(run), str(tmp_path / "plain.onnx"), "--batch-size", "4", "--trust", "tests"]) == 0
    assert "conv_impl native (trained with auto)" in capsys.readouterr().out
    _, images = val_digits(8)
    network = PlainConvNet()  # MindSpore's own convolutions, the checkpoint's weights by MindSpore's loader
    saved = ms.load_checkpoint(str(run / "checkpoints" / "best.ckpt"))
    assert not ms.load_param_into_net(network, {p.name: saved[p.name] for p in network.get_parameters()},
                                      strict_load=True)[0]
    network.set_train(False)
    live = network(ms.Tensor(images)).asnumpy()
    session = onnxruntime.InferenceSession(str(tmp_path / "plain.onnx"), providers=["CPUExecutionProvider"])
    (feed,) = session.get_inputs()
    got = np.concatenate([session.run(None, {feed.name: images[i:i + 4]})[0] for i in range(0, 8, 4)])
    np.testing.assert_allclose(got, live, atol=1e-4 * max(1.0, np.abs(live).max()), rtol=0)


def test_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing(digits_run, tmp_path, capsys, monkeypatch):
    """MindSpore's MindIR writer on a full disk: part of the file written, then ENOSPC from a write that names no
    file. As the command runs main (``tool_status``): one line naming model.mindir, status 1, nothing left.
    Mutation caught: the export without ``written_whole`` (a traceback naming no file, the temporary file left)."""
    import errno
    import os

    from trainkit.process.tool_command import tool_status

    def full_disk(network, example, file_name, file_format):
        with open(file_name, "wb") as stream:
            stream.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ms, "export", full_disk)
    output = tmp_path / "model.mindir"
    assert tool_status(lambda: main([str(digits_run), str(output)])) == 1
    assert capsys.readouterr().err == (f"trainkit: error: {output} could not be written: the disk is full (No space "
                                       "left on device); nothing partial was left\n")
    assert list(tmp_path.iterdir()) == []
