"""What `python -m trainkit` leaves behind when it fails, run as a user would: from a directory of their own,
without GLOG_v in the environment."""
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.common.cifar10_files import write_cifar10

REPO = Path(__file__).resolve().parents[2]


def tree_digest(folder: Path):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def trainkit(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}  # as `python -m trainkit` runs outside make
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_crash_is_logged_in_full_the_cwd_stays_empty_and_a_refused_run_dir_is_untouched(tmp_path):
    root, cwd, run_dir = tmp_path / "cifar10", tmp_path / "cwd", tmp_path / "run"
    write_cifar10(str(root), train_per_file=10, test_records=8, seed=5)
    cwd.mkdir()
    common = ["recipe=resnet50_cifar10", f"data.root={root}", "data.val_fraction=0.2",
              "data.image_size=8", "data.batch_size=8",
              "trainer.epochs=1", f"hydra.run.dir={run_dir}"]
    crashed = trainkit(*common, "model._target_=tests.common.broken_models.NotCompilable",
                       "~model.zero_init_residual", "~model.conv_impl", cwd=cwd)

    assert crashed.returncode == 1, crashed.stderr[-3000:]
    last_line = crashed.stderr.strip().splitlines()[-1]
    crash = re.fullmatch(rf"trainkit: error: the run crashed \((\w+)\); the full traceback is in "
                         rf"{re.escape(str(run_dir / 'train.log'))}", last_line)
    assert crash, last_line
    log = (run_dir / "train.log").read_text()
    assert "Traceback (most recent call last)" in log and f"\n{crash.group(1)}: " in log  # the whole traceback
    assert sorted(os.listdir(cwd)) == []  # MindSpore's compiler dump went to the run directory
    assert (run_dir / "rank_0" / "om" / "analyze_fail.ir").is_file()
    assert "[WARNING]" not in crashed.stderr  # MindSpore's own warnings are off by default

    before = tree_digest(run_dir)
    refused = trainkit(*common, cwd=cwd)
    assert refused.returncode == 2
    assert f"trainkit: error: {run_dir} already holds a run" in refused.stderr
    assert tree_digest(run_dir) == before  # not even an ERROR line appended to its train.log


def test_mindspore_log_level_is_errors_only_unless_the_logger_key_or_glog_v_asks(monkeypatch):
    from trainkit.__main__ import _mindspore_log_level

    monkeypatch.delenv("GLOG_v", raising=False)
    assert _mindspore_log_level(["recipe=resnet50_cifar10"]) == "3"
    assert _mindspore_log_level(["logger.mindspore_warnings=true"]) == "2"
    monkeypatch.setenv("GLOG_v", "1")
    assert _mindspore_log_level([]) == "1"  # the user's own GLOG_v
    assert _mindspore_log_level(["logger.mindspore_warnings=false"]) == "3"  # the command line decides


def test_the_startup_lines_count_says_it_counts_the_trainable_parameters():
    from mindspore import nn

    from trainkit.app import run as app_run

    network = nn.SequentialCell(nn.Dense(4, 3), nn.BatchNorm1d(3))
    network[0].weight.requires_grad = False  # frozen: 12 left out, as are the 6 moving statistics
    assert app_run.count_parameters(network) == "9 trainable parameters"  # 3 bias + 3 gamma + 3 beta


def test_the_startup_lines_name_the_path_the_fused_passes_take_and_both_paths_train(tmp_path):
    """The quick start (Adam, the logged gradient norm, EMA, small_cnn with conv_impl auto) says which kernels its
    optimizer update, gradient norm, EMA and convolutions' im2col run on; with TRAINKIT_FUSED_KERNELS=0 they are
    MindSpore's (and auto is then `unfold`)."""
    from trainkit import kernels

    common = ["trainer.epochs=1", "trainer.test=false"]
    env_off = {**os.environ, "TRAINKIT_FUSED_KERNELS": "0", "PYTHONPATH": str(REPO)}
    env_off.pop("GLOG_v", None)
    off = subprocess.run([sys.executable, "-m", "trainkit", *common, f"hydra.run.dir={tmp_path / 'off'}"],
                         cwd=tmp_path, env=env_off, capture_output=True, text=True, timeout=300)
    assert off.returncode == 0, off.stderr[-3000:]
    log = (tmp_path / "off" / "train.log").read_text()
    what = "optimizer update and gradient norm and EMA update and convolutions' im2col"
    assert f"{what}: MindSpore's kernels (TRAINKIT_FUSED_KERNELS=0)" in log
    if kernels.library()[0] is None:
        return
    on = trainkit(*common, f"hydra.run.dir={tmp_path / 'on'}", cwd=tmp_path)
    assert on.returncode == 0, on.stderr[-3000:]
    log = (tmp_path / "on" / "train.log").read_text()
    assert f"{what}: fused C++ kernels ({kernels.library()[0]})" in log
