"""Exact resume includes the network's random layers: trainkit's Dropout (the MLP's) keeps its random stream in a
Parameter, so a run resumed mid-epoch ends bitwise equal to the uninterrupted one; a layer whose stream MindSpore
keeps inside the kernel (``nn.Dropout`` on CPU) cannot resume exactly, and the resume says so in one warning."""
import logging

import numpy as np
import pytest
from mindspore import nn

from trainkit.app import train
from trainkit.app.config import compose_config


class NnDropoutMLP(nn.Cell):
    """The MLP's layout with MindSpore's own nn.Dropout."""

    def __init__(self, in_features, out_features, hidden_sizes=(8,), dropout=0.0):
        super().__init__()
        layers, width = [], in_features
        for size in hidden_sizes:
            layers += [nn.Dense(width, size), nn.ReLU(), nn.Dropout(p=dropout)]
            width = size
        self.layers = nn.SequentialCell([*layers, nn.Dense(width, out_features)])

    def construct(self, x):
        return self.layers(x)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def wine(run_dir, *extra):
    return compose_config(["recipe=wine_mlp", "model.hidden_sizes=[8,8]", "model.dropout=0.5", "trainer.epochs=2",
                           "trainer.eval_interval=0", "trainer.checkpoint_every_n_steps=1",
                           "trainer.keep_checkpoints=20", "logger.progress=off", f"run_dir={run_dir}", *extra])


def parameters(network):
    return {p.name: p.asnumpy().copy() for p in network.get_parameters()}


def resumed_from_mid_epoch(tmp_path, *extra):
    """The uninterrupted run's final parameters, the run resumed from its checkpoint at epoch 2 step 3 (8 steps an
    epoch) and the warnings of that resume."""
    uninterrupted = train(wine(tmp_path / "a", *extra))
    handler = Lines()
    logging.getLogger("trainkit").addHandler(handler)
    try:
        checkpoint = tmp_path / "a" / "checkpoints" / "trainkit-2_3.ckpt"
        resumed = train(wine(tmp_path / "b", f"trainer.resume={checkpoint}", *extra))
    finally:
        logging.getLogger("trainkit").removeHandler(handler)
    return parameters(uninterrupted.wrapper), parameters(resumed.wrapper), handler.lines


def test_the_mlp_with_dropout_resumed_mid_epoch_ends_bitwise_equal(tmp_path, mode):
    expected, actual, lines = resumed_from_mid_epoch(tmp_path, f"trainer.mode={mode}")
    assert sorted(actual) == sorted(expected)
    assert {"layers.2.calls", "layers.5.calls"} <= set(actual)  # the dropout streams' positions
    differing = [name for name in expected if not np.array_equal(actual[name], expected[name])]
    assert not differing, differing[:5]
    assert not [line for line in lines if "not exact" in line]


def test_dropout_masks_follow_p_and_differ_per_call_and_layer(graph_mode):
    import mindspore as ms

    from trainkit.models.dropout import Dropout

    ms.set_seed(3)
    first, second = Dropout(0.25), Dropout(0.25)
    first.set_train(True)
    second.set_train(True)
    ones = ms.Tensor(np.ones((200, 100), np.float32))
    a, b, c = first(ones).asnumpy(), first(ones).asnumpy(), second(ones).asnumpy()
    for mask in (a, b, c):
        assert set(np.unique(mask)) == {0.0, np.float32(1 / 0.75)}
        assert abs((mask == 0).mean() - 0.25) < 0.01  # 20,000 draws: 4 standard deviations is 0.012
    assert (a != b).mean() > 0.3 and (a != c).mean() > 0.3  # about 2 p (1 - p) = 0.375 when independent
    first.set_train(False)
    assert np.array_equal(first(ones).asnumpy(), ones.asnumpy())


def test_a_layer_whose_stream_mindspore_keeps_is_named_and_the_resume_not_called_exact(tmp_path):
    _, _, lines = resumed_from_mid_epoch(tmp_path, "model._target_=tests.app.test_resume_random.NnDropoutMLP")
    warned = [line for line in lines if line.startswith("resume is not exact")]
    assert len(warned) == 1 and warned[0].startswith(
        "resume is not exact: layers.2 (Dropout), layers.5 (Dropout) draw random numbers"), lines



@pytest.mark.slow  # 40 s: the default suite has single-process dropout resumes here and test_launch's bitwise
# data-parallel resume
def test_the_mlp_with_dropout_resumes_bitwise_in_data_parallel(tmp_path):
    """Two workers, each drawing masks of its own: the job cut back to a mid-epoch checkpoint and continued with
    trainer.resume=auto ends with the uninterrupted job's checkpoint, bit for bit."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import mindspore as ms

    repo = Path(__file__).resolve().parents[2]
    args = ["recipe=wine_mlp", "model.hidden_sizes=[8,8]", "model.dropout=0.5", "data.batch_size=8", "trainer.epochs=2",
            "trainer.eval_interval=0", "trainer.checkpoint_every_n_steps=1", "trainer.keep_checkpoints=40",
            "logger.progress=off", "parallel=data_parallel", "parallel.workers=2"]

    def job(run_dir, *extra):
        result = subprocess.run([sys.executable, "-m", "trainkit", *args, f"hydra.run.dir={run_dir}", *extra],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300,
                                env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(repo)})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    job(whole)
    shutil.copytree(whole, cut)
    final = sorted((whole / "checkpoints").glob("trainkit-2_*.ckpt"), key=lambda p: int(p.stem.split("_")[1]))[-1]
    for path in (cut / "checkpoints").glob("trainkit-*.ckpt"):
        if path.name not in ("trainkit-1_1.ckpt", "trainkit-1_2.ckpt", "trainkit-1_3.ckpt"):
            path.unlink()
    job(cut, "trainer.resume=auto")
    expected, actual = ms.load_checkpoint(str(final)), ms.load_checkpoint(str(cut / "checkpoints" / final.name))
    arrays = sorted(name for name, value in expected.items() if not isinstance(value, str))
    assert "layers.2.calls" in arrays
    assert arrays == sorted(name for name, value in actual.items() if not isinstance(value, str))
    differing = [name for name in arrays if not np.array_equal(expected[name].asnumpy(), actual[name].asnumpy())]
    assert not differing, differing[:5]


def test_each_data_parallel_rank_draws_masks_of_its_own(graph_mode, monkeypatch):
    import mindspore as ms

    from trainkit.models import dropout

    ones = ms.Tensor(np.ones((100, 100), np.float32))
    masks = []
    for rank in (0, 1, 0):
        monkeypatch.setattr(dropout, "_rank", lambda rank=rank: rank)
        ms.set_seed(3)
        layer = dropout.Dropout(0.5, stream=0)
        layer.set_train(True)
        masks.append(layer(ones).asnumpy())
    assert np.array_equal(masks[0], masks[2]) and (masks[0] != masks[1]).mean() > 0.3
