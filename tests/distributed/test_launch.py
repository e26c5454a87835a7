"""`python -m trainkit ... parallel=data_parallel parallel.workers=2` as users run it: msrun starts two CPU workers
(MCCL) that share one run directory; a failing worker ends the job with its log tail and leaves no process behind;
bad parallel values stop before anything starts."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import psutil
import pytest
import yaml

from tests.common.callbacks import read_jsonl
from tests.common.cifar10_files import validation_indices, write_cifar10
from tests.common.processes import processes_mentioning
from trainkit.app.config import compose_config
from trainkit.distributed.launch import free_port
from trainkit.distributed.parallel import check_parallel
from trainkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TRAIN_PER_FILE, TEST_RECORDS, BATCH, EPOCHS, WORKERS = 10, 20, 4, 2, 2
STEPS_PER_EPOCH = 5 * TRAIN_PER_FILE * 4 // 5 // (BATCH * WORKERS)  # each rank reads its half of the 40 training
# records (data.val_fraction=0.2 holds 10 of the 50 out for validation)
MEAN, STD = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2023, 0.1994, 0.2010])


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar10")
    return root, write_cifar10(str(root), train_per_file=TRAIN_PER_FILE, test_records=TEST_RECORDS, seed=3)


def validation(written):
    return validation_indices(written["train_labels"], 0.2)


def tiny(root, *overrides):
    return ["recipe=resnet50_cifar10", "model=small_cnn", "model.width=4", f"data.root={root}", "data.val_fraction=0.2",
            "data.image_size=8",
            f"data.batch_size={BATCH}", "data.num_parallel_workers=1", f"trainer.epochs={EPOCHS}",
            "logger.log_every_n_steps=1", "logger.progress=log", "parallel=data_parallel",
            f"parallel.workers={WORKERS}", *overrides]


def trainkit(*args, cwd):
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainkit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def numpy_eval(network, images, labels):
    """Accuracy and mean cross-entropy of `network` on the whole eval set, with the eval transform in NumPy
    (MindSpore's Resize 32 -> 8 is the one step taken from the pipeline, as in tests/test_app.py)."""
    from mindspore.dataset import vision

    network.set_train(False)
    resized = np.stack([vision.Resize(8)(image) for image in images]).astype(np.float64)
    x = ((resized / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2).astype(np.float32)
    logits = network(ms.Tensor(x)).asnumpy().astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(np.mean(logits.argmax(axis=1) == labels)), float(-log_softmax[np.arange(len(labels)), labels].mean())


def test_two_workers_train_end_to_end_into_one_run_directory(cifar10, tmp_path):
    from trainkit.models.small_cnn import SmallCNN

    root, written = cifar10
    data_root = tmp_path / "data"  # its own copy: rank 0 leaves a marker there
    shutil.copytree(root, data_root)
    result = trainkit(*tiny(data_root, "parallel.lr_scaling=linear",
                            "data._target_=tests.distributed.data_modules.PreparedByRankZeroFirst"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not processes_mentioning(str(tmp_path))

    run_dirs = list((tmp_path / "outputs" / "resnet50_cifar10").iterdir())
    assert len(run_dirs) == 1  # the launcher fixed hydra.run.dir for every rank
    run_dir = run_dirs[0]
    assert sorted(p.name for p in (run_dir / "msrun_logs").iterdir()) == ["joined-0", "joined-1",
                                                                          "rank-0.pid", "rank-1.pid",
                                                                          "scheduler.log", "worker_0.log",
                                                                          "worker_1.log"]
    log = (run_dir / "train.log").read_text()
    assert log.count("finished:") == 1  # rank 0 writes it, rank 1 logs into msrun_logs/worker_1.log only
    assert "finished:" in (run_dir / "msrun_logs" / "worker_1.log").read_text()
    assert "finished:" in result.stdout  # rank 0's log on the launcher's console
    assert (data_root / "prepared_by_rank_0").exists()  # rank 1 prepared only after rank 0 (else it raises)

    records = read_jsonl(run_dir / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))  # one writer, a sharded epoch
    assert all(r["train/learning_rate"] == pytest.approx(0.001 * WORKERS) for r in records
               if "train/learning_rate" in r)  # linear scaling of the seed's lr 0.001
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.suffix == ".ckpt")
    assert checkpoints == ["best.ckpt"] + [f"trainkit-{e}_{STEPS_PER_EPOCH}.ckpt" for e in range(1, EPOCHS + 1)]

    # the reported evaluation covers the whole eval set (not rank 0's shard), with rank 0's weights
    network = SmallCNN(num_classes=10, in_channels=3, width=4)
    network_not_loaded, _ = ms.load_param_into_net(network, ms.load_checkpoint(
        str(run_dir / "checkpoints" / checkpoints[-1])))
    assert not network_not_loaded
    accuracy, loss = numpy_eval(network, written["train_images"][validation(written)],
                               written["train_labels"][validation(written)])
    last_eval = [r for r in records if "eval/accuracy" in r][-1]
    assert last_eval["eval/accuracy"] == pytest.approx(accuracy)
    assert last_eval["eval/loss"] == pytest.approx(loss, rel=1e-5)

    finished = dict(re.findall(r"(\w+) ([\d.e+-]+)", log.split("finished:")[1].splitlines()[0]))
    assert float(finished["workers"]) == WORKERS and float(finished["global_batch_size"]) == BATCH * WORKERS
    samples = EPOCHS * STEPS_PER_EPOCH * BATCH * WORKERS  # job-wide, not rank 0's
    assert float(finished["samples_per_second"]) * float(finished["train_seconds"]) == pytest.approx(samples,
                                                                                                     rel=1e-2)


def test_a_failing_worker_ends_the_job_with_its_log_tail_and_leaves_no_process(cifar10, tmp_path):
    root, _ = cifar10
    run_dir, pid_dir = tmp_path / "run", tmp_path / "pids"
    pid_dir.mkdir()
    result = trainkit(*tiny(root, "data._target_=tests.distributed.data_modules.CrashOnRank", "+data.crash_rank=1",
                            f"+data.pid_dir={pid_dir}", f"hydra.run.dir={run_dir}"), cwd=tmp_path)
    assert result.returncode == 1
    assert "trainkit: error: worker rank 1" in result.stderr
    assert "RuntimeError: planted failure on rank 1" in result.stderr  # the rank's log tail, on the console
    worker_pids = [int(p.read_text()) for p in pid_dir.iterdir()]
    assert len(worker_pids) == WORKERS
    assert not [pid for pid in worker_pids if psutil.pid_exists(pid) and
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not processes_mentioning(str(run_dir))  # msrun, its scheduler and its log tails too


def test_a_worker_gone_before_the_launcher_saw_it_is_still_named_by_its_rank(tmp_path, capsys):
    """The race of a worker that fails at once: msrun names its pid, the launcher never saw the process, and every
    log shows an error (msrun killed the others). The pid file the worker wrote names the rank."""
    from trainkit.distributed.launch import _Failure, _MsrunJob

    for rank, pid in ((0, 4001), (1, 4002)):
        (tmp_path / f"worker_{rank}.log").write_text(f"Traceback (most recent call last):\nError on rank {rank}\n")
        (tmp_path / f"rank-{rank}.pid").write_text(str(pid))
    job = _MsrunJob(command=[], env={}, shown_log=tmp_path / "worker_0.log", failure=_Failure(pid=4002, status=1))
    job._report_failure(1)
    first = capsys.readouterr().err.splitlines()
    assert first[0] == ("trainkit: error: worker rank 1 (pid 4002) exited with status 1; msrun stopped the other "
                        "workers.")
    assert first[1] == f"--- the last lines of {tmp_path / 'worker_1.log'}:"  # its own log first


@pytest.mark.parametrize("overrides, message", [
    (["parallel.workers=0"], "parallel.workers=0 is not valid: it must be an integer >= 1"),
    (["parallel.nodes=0"], "parallel.nodes=0 is not valid: it must be an integer >= 1"),
    (["parallel.nodes=2", "parallel.node_rank=2", "parallel.master_port=8118"],
     r"parallel.node_rank=2 is not valid: it must be an integer in \[0, parallel.nodes - 1\] = \[0, 1\]"),
    (["parallel.master_port=80"], r"parallel.master_port=80 is not valid: .* a port in \[1024, 65535\]"),
    (["parallel.master_port=70000"], r"parallel.master_port=70000 is not valid"),
    (["parallel.nodes=2"], "parallel.master_port is not set: with parallel.nodes=2"),
    (["parallel=stand_alone", "parallel.workers=2"], "parallel.workers=2 needs a parallel mode"),
    (["parallel.master_addr=''"], "parallel.master_addr='' is not valid: it must be the IP address"),
    (["parallel=semi_auto_parallel"], "parallel.mode=semi_auto_parallel runs on Ascend and GPU only"),
])
def test_bad_parallel_values_name_the_key(overrides, message):
    cfg = compose_config(["parallel=data_parallel", *overrides, "run_dir=/unused"])
    with pytest.raises(ConfigError, match=message):
        check_parallel(cfg.parallel, "CPU")


def test_bad_parallel_values_stop_the_command_before_msrun_starts(cifar10, tmp_path):
    root, _ = cifar10
    run_dir = tmp_path / "run"
    result = trainkit(*tiny(root, "parallel.nodes=2", "parallel.node_rank=2", f"parallel.master_port={free_port()}",
                            f"hydra.run.dir={run_dir}"), cwd=tmp_path)
    assert result.returncode == 2
    assert "trainkit: error: parallel.node_rank=2 is not valid" in result.stderr
    assert not (run_dir / "msrun_logs").exists() and not (run_dir / ".hydra").exists()


def test_the_same_command_under_an_external_msrun_trains_as_one_job(cifar10, tmp_path):
    root, _ = cifar10
    run_dir, log_dir = tmp_path / "run", tmp_path / "msrun_logs"
    interpreter_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO),
           "PATH": interpreter_dir + os.pathsep + os.environ["PATH"]}  # msrun starts the first `python` on PATH
    command = [shutil.which("msrun", path=interpreter_dir), f"--worker_num={WORKERS}",
               f"--local_worker_num={WORKERS}", f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True",
               "python", "-m", "trainkit", *tiny(root, f"hydra.run.dir={run_dir}")]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not processes_mentioning(str(run_dir))
    assert (run_dir / "train.log").read_text().count("finished:") == 1
    assert not (run_dir / "msrun_logs").exists()  # no second launch from inside msrun
    train_steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
    assert train_steps == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert "finished:" in (log_dir / "worker_1.log").read_text()


RESUME_FEATURES = ["wrapper.accumulation_steps=2", "wrapper.ema_decay=0.9", "trainer.checkpoint_every_n_steps=1",
                   "trainer.keep_checkpoints=20", "trainer.eval_interval=0",
                   "callbacks=[{_target_:tests.app.stateful_callbacks.Tally}]"]  # a user callback with state of its own


@pytest.fixture(scope="module")
def whole(cifar10, tmp_path_factory):
    """A 2-worker run that nothing interrupts, the reference of the resumed ones."""
    root, _ = cifar10
    run_dir = tmp_path_factory.mktemp("whole")
    result = trainkit(*tiny(root, *RESUME_FEATURES), f"hydra.run.dir={run_dir}", cwd=run_dir.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


def assert_same_checkpoint(run_dir, reference, name=f"trainkit-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt"):
    expected = ms.load_checkpoint(str(reference / "checkpoints" / name))
    actual = ms.load_checkpoint(str(run_dir / "checkpoints" / name))
    arrays = [name for name, value in expected.items() if not isinstance(value, str)]
    assert sorted(arrays) == sorted(name for name, value in actual.items() if not isinstance(value, str))
    differing = [name for name in arrays if not np.array_equal(expected[name].asnumpy(), actual[name].asnumpy())]
    assert not differing, differing[:5]


def test_a_data_parallel_run_resumes_in_place_and_ends_bitwise_equal(cifar10, whole, tmp_path):
    """Both runs on 2 workers: the whole run, and a copy cut back to its checkpoint after micro-batch 3 (inside an
    epoch and an accumulation window), continued with trainer.resume=auto in its own directory."""
    root, _ = cifar10
    features = RESUME_FEATURES
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for path in (cut / "checkpoints").glob("trainkit-*.ckpt"):
        if path.name not in ("trainkit-1_1.ckpt", "trainkit-1_2.ckpt", "trainkit-1_3.ckpt"):
            path.unlink()
    result = trainkit(*tiny(root, *features), f"hydra.run.dir={cut}", "trainer.resume=auto", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resuming from" in (cut / "msrun_logs" / "worker_1.log").read_text()  # every rank resumed
    assert (cut / "msrun_logs-1" / "worker_0.log").exists()  # the first job's logs are kept
    assert_same_checkpoint(cut, whole)

    def tally(run_dir):  # what the user's callback logged at each epoch end: its count of steps continues
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["custom/steps_seen"]) for r in map(json.loads, lines) if "custom/steps_seen" in r]

    assert tally(cut) == tally(whole) == [(e * STEPS_PER_EPOCH, e * STEPS_PER_EPOCH) for e in range(1, EPOCHS + 1)]


def test_sigterm_to_the_launcher_stops_every_rank_after_the_same_step_with_one_checkpoint_there(cifar10, whole,
                                                                                               tmp_path):
    """SIGTERM reaches the launcher only (as a scheduler sends it); it forwards it to both workers, which agree on the
    step to stop after; rank 0 writes its checkpoint there, bitwise the uninterrupted run's at that step (so
    resume=auto continues exactly, as the test above shows for any checkpoint); no process is left."""
    import signal
    import time

    root, _ = cifar10
    run_dir = tmp_path / "run"
    slow = ["data._target_=tests.common.slow_data.SlowCifar10", "+data.batch_seconds=0.2"]
    args = [sys.executable, "-m", "trainkit", *tiny(root, *RESUME_FEATURES, *slow), f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = run_dir / "checkpoints" / "trainkit-1_2.ckpt"
    deadline = time.time() + 240
    while time.time() < deadline and launcher.poll() is None and not second.exists():
        time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)
    stdout, stderr = launcher.communicate(timeout=240)
    assert launcher.returncode == 128 + signal.SIGTERM, stdout[-3000:] + stderr[-3000:]
    assert "SIGTERM forwarded to the workers" in stderr
    assert not processes_mentioning(str(run_dir))
    stopped = {}
    for rank in range(WORKERS):
        lines = [line for line in (run_dir / "msrun_logs" / f"worker_{rank}.log").read_text().splitlines()
                 if "stopped by SIGTERM after step" in line]
        assert len(lines) == 1, rank
        stopped[rank] = int(lines[0].split(" after step ")[1].split(" ")[0])
    step = stopped[0]
    assert stopped[1] == step < EPOCHS * STEPS_PER_EPOCH  # the same step on every rank
    assert "stopped by SIGTERM" in stdout and "trainer.resume=auto" in stdout  # rank 0's line, on the console
    epoch, in_epoch = divmod(step - 1, STEPS_PER_EPOCH)
    at_stop = f"trainkit-{epoch + 1}_{in_epoch + 1}.ckpt"
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("trainkit-*.ckpt"))[-1] == at_stop
    assert_same_checkpoint(run_dir, whole, at_stop)
    train_steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
    assert train_steps == list(range(1, step + 1))


@pytest.mark.slow  # 38 s; the mean: test_sweep_repeats (in-process), data parallel: the tests above
def test_a_sweep_of_data_parallel_runs_returns_the_mean_of_each_trial_s_repeats(cifar10, tmp_path):
    """One Optuna trial of two data-parallel repeats (sweep.repeats=2): jobs 0 and 1, seeds 0 and 1, and the trial's
    value is the mean of their best values. Mutation: the launcher returning the first repeat's value (red)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    root, _ = cifar10
    result = trainkit("-m", *tiny(root, "trainer.epochs=1"), "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1",
                      "sweep.repeats=2", "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0",
                      "optimizer.lr=interval(0.001,0.01)", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]  # NaN was a failed trial
    (sweep,) = (tmp_path / "multirun" / "resnet50_cifar10").iterdir()
    bests = {}
    for job in ("0", "1"):  # rank 0's records of each job, read here
        values = [r["eval/accuracy"] for r in read_jsonl(sweep / job / "metrics.jsonl") if "eval/accuracy" in r]
        bests[job] = max(values)
        assert yaml.safe_load((sweep / job / ".hydra" / "config.yaml").read_text())["trainer"]["seed"] == int(job)
    optimization = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert optimization["best_value"] == pytest.approx(np.mean(list(bests.values())), abs=1e-9)
    summary = json.loads((sweep / "summary.json").read_text())
    assert {str(row["job"]): row["best"] for row in summary["jobs"]} == pytest.approx(bests)
    (group,) = summary["groups"]
    assert group["n"] == 2 and group["best"]["mean"] == pytest.approx(np.mean(list(bests.values())), abs=1e-9)


def test_the_failing_rank_is_read_from_the_only_worker_log_with_an_error(tmp_path):
    """A worker that fails before the launcher's next look at msrun's processes is named from its log on disk."""
    from trainkit.distributed.launch import _rank_of_the_only_failing_log

    (tmp_path / "scheduler.log").write_text("scheduler up\n")
    (tmp_path / "worker_0.log").write_text("epoch 1 ...\n")
    (tmp_path / "worker_1.log").write_text("Traceback (most recent call last):\nRuntimeError: planted\n")
    assert _rank_of_the_only_failing_log(tmp_path) == "1"
    (tmp_path / "worker_0.log").write_text("Traceback (most recent call last):\nValueError\n")
    assert _rank_of_the_only_failing_log(tmp_path) is None  # two candidates: none is named
