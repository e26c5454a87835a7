"""Data parallel through msrun (2 CPU workers, MCCL): gradients reduced before accumulation, clipping and
the overflow decision, so 2 ranks with batch b equal one process with batch 2b and stay identical."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.common.models import batches, initial_weights
from tests.common.reference import Adam, ReferenceTrainer

SETTINGS = dict(lr=0.05, accumulation_steps=2, max_grad_norm=0.5, ema_decay=0.8, loss_scale=2.0 ** 8,
                scale_window=2)
NAN_MICRO_BATCH = 3  # second micro-batch of the second window, on rank 1 only
REPO = Path(__file__).resolve().parents[2]


def global_batches():
    return batches(4 * SETTINGS["accumulation_steps"], 6, seed=23)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(tmp_path: Path, workers: int = 2) -> None:
    msrun = shutil.which("msrun", path=os.path.dirname(sys.executable))
    if msrun is None:
        pytest.fail("msrun (installed with mindspore) is not next to the interpreter running the tests")
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])  # msrun runs `python`
    logs = tmp_path / "logs"
    cmd = [msrun, f"--worker_num={workers}", f"--local_worker_num={workers}", f"--master_port={free_port()}",
           f"--log_dir={logs}", "--join=True", str(REPO / "tests/distributed/data_parallel_worker.py"),
           str(tmp_path)]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        tails = "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:])
                          for log in sorted(logs.glob("*.log")))
        said = "\n".join((result.stdout + result.stderr).splitlines()[-25:])  # which process ended, and how
        pytest.fail(f"msrun exited with {result.returncode}\n--- msrun's output\n{said}\n{tails}")


def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path):
    launch(tmp_path)
    ranks = [dict(np.load(tmp_path / f"rank_{r}.npz")) for r in range(2)]

    data = global_batches()
    data[NAN_MICRO_BATCH][0][3, 0] = np.nan  # row 0 of rank 1's half
    ref = ReferenceTrainer(initial_weights(), Adam(SETTINGS["lr"]), accumulation_steps=SETTINGS["accumulation_steps"],
                           max_grad_norm=SETTINGS["max_grad_norm"], ema_decay=SETTINGS["ema_decay"],
                           loss_scale=SETTINGS["loss_scale"], scale_factor=2, scale_window=SETTINGS["scale_window"])
    for x, y in data:
        ref.micro_step(x, y)
    # every feature acts: the planted window overflows, the scale backs off and grows back, clipping binds
    assert ref.overflows[NAN_MICRO_BATCH]
    assert min(ref.scales_used) < SETTINGS["loss_scale"] == ref.scale
    assert max(ref.grad_norms) > SETTINGS["max_grad_norm"]
    assert ref.optimizer_steps == len(data) // SETTINGS["accumulation_steps"] - 1

    for state in ranks:  # the planted window is skipped on both ranks
        assert list(state["overflow"]) == ref.overflows
        assert list(state["scale_used"]) == ref.scales_used
        assert float(state["loss_scale.scale_value"]) == ref.scale
        finite = np.isfinite(ref.grad_norms)
        np.testing.assert_allclose(state["grad_norm"][finite], np.array(ref.grad_norms)[finite], rtol=1e-5)
        for name, value in ref.params.items():
            np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(state["ema." + name], ref.ema[name], rtol=1e-5, atol=1e-5, err_msg=name)
    # and the ranks hold identical state, the window's gradient sum included (rank 0's checkpoint restores every
    # rank); the guard's loss sum is each rank's own share of the batch
    for key in ranks[0]:
        if not key.startswith("_loss_sum"):
            np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
