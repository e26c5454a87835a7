"""RunLog: the JSON-lines file and the TensorBoard events read back equal to what was recorded."""
import math
import time

import numpy as np
import pytest
from mindspore import Tensor
from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

from tests.common.callbacks import read_jsonl
from tests.common.tensorboard_events import event_files, read_events, read_scalars, read_tags
from trainkit.callbacks import RunLog


def test_scalars_go_to_jsonl_and_tensorboard(tmp_path):
    before = time.time()
    with RunLog(tmp_path / "run") as log:
        log.scalars(10, {"train/loss": 0.5, "train/learning_rate": 0.1}, epoch=1)
        log.scalars(20, {"train/loss": np.float32(0.25), "train/skipped_steps": 3}, epoch=1)
        log.scalars(25, {"eval/accuracy": Tensor(np.array([0.75], np.float32))})
    after = time.time()

    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [10, 20, 25]
    assert [r["epoch"] for r in records] == [1, 1, None]
    assert all(before <= r["time"] <= after for r in records)
    assert records[0] == {"step": 10, "optimizer_step": 10, "epoch": 1, "time": records[0]["time"],
                          "train/loss": 0.5, "train/learning_rate": 0.1}  # one micro-batch per optimizer step here
    assert records[1]["train/loss"] == 0.25 and records[1]["train/skipped_steps"] == 3
    assert isinstance(records[1]["train/skipped_steps"], int)
    assert records[2]["eval/accuracy"] == 0.75

    scalars = read_scalars(tmp_path / "run" / "tensorboard")
    assert scalars == {"train/loss": [(10, 0.5), (20, 0.25)], "train/learning_rate": [(10, np.float32(0.1))],
                       "train/skipped_steps": [(20, 3.0)], "eval/accuracy": [(25, 0.75)]}


def test_each_record_is_on_disk_before_close(tmp_path):
    log = RunLog(tmp_path, tensorboard=True)
    log.scalars(1, {"a": 1.0})
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["a"] == 1.0  # flushed: a crash now loses nothing
    assert read_scalars(tmp_path / "tensorboard") == {"a": [(1, 1.0)]}
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        log.scalars(2, {"a": 2.0})


def test_an_existing_metrics_file_is_appended_to(tmp_path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.scalars(1, {"a": 1.0})
    with RunLog(tmp_path, tensorboard=False) as log:  # a resumed run
        log.scalars(2, {"a": 2.0})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    assert not (tmp_path / "tensorboard").exists()


def test_non_finite_values_read_back(tmp_path):
    with RunLog(tmp_path) as log:
        log.scalars(3, {"train/loss": float("nan"), "train/grad_norm": float("inf")})
    record = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert math.isnan(record["train/loss"]) and record["train/grad_norm"] == math.inf
    scalars = read_scalars(tmp_path / "tensorboard")
    assert math.isnan(scalars["train/loss"][0][1]) and scalars["train/grad_norm"] == [(3, math.inf)]


def test_bad_values_are_refused(tmp_path):
    with RunLog(tmp_path, metrics_file=None) as log:
        with pytest.raises(ValueError, match="reserved"):
            log.scalars(1, {"step": 1.0})
        with pytest.raises(ValueError, match="scalar"):
            log.scalars(1, {"a": np.zeros(3)})
        with pytest.raises(TypeError, match="'a' must be a number"):
            log.scalars(1, {"a": "high"})
    assert not (tmp_path / "metrics.jsonl").exists()


def test_hparams_are_flattened_for_the_hparams_plugin(tmp_path):
    with RunLog(tmp_path) as log:
        log.hparams({"optimizer": {"name": "adam", "lr": 0.1, "betas": [0.9, 0.99]}, "epochs": 90, "ema": None},
                    {"hparam/accuracy": 0.875})
    hparams_dir = tmp_path / "tensorboard" / "hparams"
    assert read_scalars(hparams_dir) == {"hparam/accuracy": [(0, 0.875)]}
    start = None
    for path in event_files(hparams_dir):
        for event in read_events(path):
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    start = HParamsPluginData.FromString(value.metadata.plugin_data.content).session_start_info
    assert start is not None
    assert start.hparams["optimizer.lr"].number_value == 0.1
    assert start.hparams["optimizer.name"].string_value == "adam"
    assert start.hparams["optimizer.betas"].string_value == "[0.9, 0.99]"
    assert start.hparams["epochs"].number_value == 90
    assert read_scalars(tmp_path / "tensorboard") == {}  # the training curves' run is untouched


def test_text_goes_to_tensorboard_only(tmp_path):
    with RunLog(tmp_path) as log:
        log.text("config", "model: resnet18")
    assert read_tags(tmp_path / "tensorboard")["config/text_summary"] == "text"
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_importing_it_leaves_pytorch_unimported_and_importable():
    import subprocess
    import sys

    pytest.importorskip("torch")  # with PyTorch installed, tensorboardX's package would import it (2 s)
    code = ("import sys; import trainkit.callbacks.run_log; print('torch' in sys.modules); import torch; "
            "print(torch.zeros(2).sum().item())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "0.0"]
    code = "import torch, sys; import trainkit.callbacks.run_log; print(sys.modules['torch'] is torch)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True"]


def test_every_record_counts_optimizer_steps_beside_micro_batches(tmp_path):
    with RunLog(tmp_path, tensorboard=False, accumulation_steps=4) as log:
        for step in (1, 3, 4, 7, 8, 9):
            log.scalars(step, {"train/loss": 1.0})
    assert [(r["step"], r["optimizer_step"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [
        (1, 0), (3, 0), (4, 1), (7, 1), (8, 2), (9, 2)]  # windows of 4 completed by each step


def test_a_record_is_flushed_without_fsync(tmp_path, monkeypatch):
    """A record reaches the OS (a reader sees it) without an fsync per record: tensorboardX's flush fsyncs, ~5 ms a
    record, 12 % of the quick start's steps (bench row 4). Mutation caught: EventFile.write calling
    ``self._writer.flush()`` (tensorboardX's) again."""
    import os

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    log = RunLog(tmp_path, tensorboard=True)
    synced.clear()  # creating the event file may sync once
    for step in range(1, 4):
        log.scalars(step, {"a": float(step)})
    assert read_scalars(tmp_path / "tensorboard") == {"a": [(1, 1.0), (2, 2.0), (3, 3.0)]}
    assert synced == []
    log.close()
    assert read_scalars(tmp_path / "tensorboard") == {"a": [(1, 1.0), (2, 2.0), (3, 3.0)]}


def test_a_record_is_one_event(tmp_path):
    """A record's values go into one TensorBoard Event (tensorboardX's protobuf is pure Python: ~0.3 ms an Event),
    each value still under its own tag. Mutation caught: one Event per value again."""
    with RunLog(tmp_path, tensorboard=True, metrics_file=None) as log:
        log.scalars(5, {"train/loss": 0.5, "train/learning_rate": 0.01, "train/grad_norm": 2.0})
        log.scalars(10, {"train/loss": 0.25})
    events = [event for path in event_files(tmp_path / "tensorboard") for event in read_events(path)
              if event.HasField("summary")]
    assert [(event.step, len(event.summary.value)) for event in events] == [(5, 3), (10, 1)]
    assert read_scalars(tmp_path / "tensorboard") == {
        "train/loss": [(5, 0.5), (10, 0.25)], "train/learning_rate": [(5, pytest.approx(0.01))],
        "train/grad_norm": [(5, 2.0)]}


def test_merged_still_works_for_a_release_and_says_it_is_deprecated():
    import pytest
    from tensorboardX import summary as tb_summary

    from trainkit.callbacks.run_log import merged

    with pytest.warns(DeprecationWarning, match="scalars_summary"):
        summary = merged([tb_summary.scalar("a", 1.5), tb_summary.scalar("b", -2.0)])
    assert [(value.tag, value.simple_value) for value in summary.value] == [("a", 1.5), ("b", -2.0)]
