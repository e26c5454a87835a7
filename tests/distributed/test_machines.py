"""One job on two machines: ``parallel.nodes=2``, one worker each. The fast tests run both launchers' meeting on
this host; the slow ones make two machines with Linux network namespaces joined by a veth pair (10.77.0.1 and
10.77.0.2, as root with ``ip``; skipped elsewhere) and train the tiny CIFAR-10 run of tests/distributed/test_launch.py
in both layouts: one shared run directory, and one per machine."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.common.callbacks import read_jsonl
from tests.common.processes import processes_mentioning
from tests.distributed import test_launch
from tests.distributed.test_launch import REPO, assert_same_checkpoint, tiny
from trainkit.distributed.launch import free_port
from trainkit.errors import ConfigError

cifar10 = test_launch.cifar10  # the fixture
EPOCHS, STEPS_PER_EPOCH = 2, 5  # 40 training records, batch 4 on each of the 2 ranks
ONE_EACH = ["parallel.workers=1", "parallel.nodes=2", "trainer.checkpoint_every_n_steps=1",
            "trainer.keep_checkpoints=20", "trainer.eval_interval=0"]


def command(root, node_rank, run_dir, port, address, *extra):
    return [sys.executable, "-m", "trainkit", *tiny(root, *ONE_EACH), f"parallel.node_rank={node_rank}",
            f"parallel.master_addr={address}", f"parallel.master_port={port}", f"hydra.run.dir={run_dir}", *extra]


def start(args, cwd, namespace=None):
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    return subprocess.Popen(prefix + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("trainkit:")]


# ------------------------------------------------------------------------------------------ no machine joins
@pytest.mark.parametrize("node_rank", [0, 1])
def test_a_machine_whose_peer_never_joins_stops_with_one_line_naming_it(cifar10, tmp_path, node_rank):
    """Mutation caught: machine 0's meeting without its deadline check waited past the test's 120 s."""
    root, _ = cifar10
    port, run_dir = free_port(), tmp_path / "run"
    started = time.monotonic()
    launcher = start(command(root, node_rank, run_dir, port, "127.0.0.1", "parallel.join_timeout=2"), tmp_path)
    stdout, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 1, stdout[-2000:] + stderr[-2000:]
    missing = (f"machine(s) 1 (rank(s) 1) did not join within parallel.join_timeout=2s at 127.0.0.1:{port + 1}"
               if node_rank == 0 else
               f"machine 0 (rank(s) 0) did not answer within parallel.join_timeout=2s at 127.0.0.1:{port + 1}")
    lines = error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith(f"trainkit: error: {missing}"), stderr[-2000:]
    assert time.monotonic() - started < 60  # start-up and 2 s, not msrun's 600 s
    assert not (run_dir / "msrun_logs").exists() and not (run_dir / ".trainkit.lock").exists()


def test_sigterm_stops_a_launcher_at_once_while_it_waits_for_its_peers(cifar10, tmp_path):
    """Machine 0 alone, waiting for machine 1 (join_timeout 300 s): SIGTERM once it says it waits ends it in
    seconds, with 143 (before the meeting, msrun's workers waited in init and ignored it: see the test below)."""
    root, _ = cifar10
    port = free_port()
    launcher = start(command(root, 0, tmp_path / "run", port, "127.0.0.1", "parallel.join_timeout=300"), tmp_path)
    seen = []
    for line in launcher.stdout:  # its own word that it waits now
        seen.append(line)
        if "waiting up to 300s (parallel.join_timeout) for machine(s) 1" in line:
            break
    signalled = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    stdout, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, "".join(seen)[-2000:] + stdout[-2000:] + stderr[-2000:]
    assert time.monotonic() - signalled < 15  # about 5 s here, most of it the interpreter's exit (MindSpore's)
    assert not processes_mentioning(str(tmp_path / "run"))


def test_a_machine_with_another_config_is_refused_on_both(cifar10, tmp_path):
    """Mutation caught: without the meeting's signature comparison, msrun started and the workers' own start
    check stopped them later, as a worker failure with log tails instead of this one line on both machines."""
    root, _ = cifar10
    port = free_port()
    first = start(command(root, 0, tmp_path / "a", port, "127.0.0.1", "parallel.join_timeout=60"), tmp_path)
    second = start(command(root, 1, tmp_path / "b", port, "127.0.0.1", "parallel.join_timeout=60",
                           "optimizer.lr=0.5"), tmp_path)
    results = [process.communicate(timeout=120) for process in (first, second)]
    for process, (stdout, stderr) in zip((first, second), results):
        assert process.returncode == 2, stdout[-2000:] + stderr[-2000:]
        assert error_lines(stderr) == ["trainkit: error: machine 1 (" + socket.gethostname() + ") runs another "
                                       "config than machine 0: its optimizer differ(s); give every machine the same "
                                       "command but parallel.node_rank"]


# ------------------------------------------------------------------------------------------ two machines
@pytest.fixture(scope="module")
def machines():
    """Two network namespaces joined by a veth pair: 10.77.0.1 (machine 0) and 10.77.0.2 (machine 1)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("two machines need network namespaces: run as root with iproute2's `ip`")
    tag = uuid.uuid4().hex[:6]
    names, links = (f"tk0-{tag}", f"tk1-{tag}"), (f"tkv0{tag}", f"tkv1{tag}")
    steps = [["ip", "netns", "add", names[0]], ["ip", "netns", "add", names[1]],
             ["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]]]
    for name, link, address in zip(names, links, ("10.77.0.1/24", "10.77.0.2/24")):
        steps += [["ip", "link", "set", link, "netns", name], ["ip", "-n", name, "addr", "add", address, "dev", link],
                  ["ip", "-n", name, "link", "set", link, "up"], ["ip", "-n", name, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode:
                pytest.skip(f"cannot make network namespaces here ({' '.join(step)}: {result.stderr.strip()})")
        yield names
    finally:
        for name in names:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def run_job(machines, root, run_dirs, cwd, *extra, signal_when=None, timeout=400):
    """Both launchers, machine 1's first; `signal_when(launchers)` may act once while they run. Their results."""
    port = 29000 + uuid.uuid4().int % 5000
    launchers = [None, None]
    for node_rank in (1, 0):
        launchers[node_rank] = start(command(root, node_rank, run_dirs[node_rank], port, "10.77.0.1", *extra), cwd,
                                     machines[node_rank])
    if signal_when is not None:
        signal_when(launchers)
    outputs = [launcher.communicate(timeout=timeout) for launcher in launchers]
    return [(launcher.returncode, *output) for launcher, output in zip(launchers, outputs)]


def wait_for(path, launchers, seconds=300):
    deadline = time.monotonic() + seconds
    while not path.exists() and all(p.poll() is None for p in launchers) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the file system for the file: the condition, not a guess at a duration
    assert path.exists(), path


def train_steps(run_dir):
    return [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]


def layout_dirs(base, layout):
    return (base / "run", base / "run") if layout == "shared" else (base / "machine0", base / "machine1")


@pytest.fixture(scope="module")
def whole(machines, cifar10, tmp_path_factory):
    """The uninterrupted two-machine run (one shared run directory), the reference of the others."""
    root, _ = cifar10
    base = tmp_path_factory.mktemp("whole")
    results = run_job(machines, root, layout_dirs(base, "shared"), base)
    for status, stdout, stderr in results:
        assert status == 0, stdout[-3000:] + stderr[-3000:]
    return base / "run"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["shared", "per_machine"])
def test_an_uninterrupted_run_trains_in_both_layouts(machines, cifar10, whole, tmp_path, layout):
    root, _ = cifar10
    dirs = layout_dirs(tmp_path, layout)
    if layout == "shared":
        run_dir = whole  # the fixture's run is the shared layout's
        dirs = (whole, whole)
    else:
        for status, stdout, stderr in run_job(machines, root, dirs, tmp_path):
            assert status == 0, stdout[-3000:] + stderr[-3000:]
        run_dir = dirs[0]
        assert_same_checkpoint(run_dir, whole)
        assert not (dirs[1] / "checkpoints").exists()  # rank 0 alone writes
    assert train_steps(run_dir) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert (run_dir / "msrun_logs" / "worker_0.log").exists()
    assert (dirs[1] / "msrun_logs_node1" / "worker_1.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["shared", "per_machine"])
def test_sigterm_then_resume_ends_bitwise_equal_in_both_layouts(machines, cifar10, whole, tmp_path, layout):
    """SIGTERM to machine 0's launcher after the checkpoint of step 2: both machines stop; the same two commands
    with trainer.resume=auto continue from the same step on both (machine 0 sends its checkpoint to machine 1's own
    directory) and end bitwise equal to the uninterrupted run, with one record per step.
    Mutation caught (per machine): without the checkpoint sent, machine 1 started at step 0 and both were refused."""
    root, _ = cifar10
    dirs = layout_dirs(tmp_path, layout)
    slow = ["data._target_=tests.common.slow_data.SlowCifar10", "+data.batch_seconds=0.2"]

    def terminate(launchers):
        wait_for(dirs[0] / "checkpoints" / "trainkit-1_2.ckpt", launchers)
        launchers[0].send_signal(signal.SIGTERM)

    first = run_job(machines, root, dirs, tmp_path, *slow, signal_when=terminate)
    assert first[0][0] == 128 + signal.SIGTERM, first[0][1][-3000:] + first[0][2][-3000:]
    assert first[1][0] == 128 + signal.SIGTERM, first[1][1][-3000:] + first[1][2][-3000:]
    assert "trainkit: the workers stopped after SIGTERM" in first[1][2]  # machine 1: a stop, not a failure
    assert not processes_mentioning(str(dirs[0])) and not processes_mentioning(str(dirs[1]))
    stopped = len(train_steps(dirs[0]))
    assert 2 <= stopped < EPOCHS * STEPS_PER_EPOCH

    second = run_job(machines, root, dirs, tmp_path, *slow, "trainer.resume=auto")
    for status, stdout, stderr in second:
        assert status == 0, stdout[-3000:] + stderr[-3000:]
    resumed_at = "micro-batches done" if layout == "shared" else str(dirs[1] / "checkpoints")
    assert resumed_at in (dirs[1] / "msrun_logs_node1" / "worker_1.log").read_text()
    assert_same_checkpoint(dirs[0], whole)
    assert train_steps(dirs[0]) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))


@pytest.mark.slow
def test_a_killed_worker_restarts_the_job_once_and_records_stay_one_per_step(machines, cifar10, whole, tmp_path):
    """parallel.max_restarts=1, a run directory per machine: machine 1's worker is SIGKILLed after step 2's
    checkpoint; both launchers log the restart with its cause, resume from the newest checkpoint and finish bitwise
    the uninterrupted run. Mutation caught: max_restarts ignored (range(1)) ended both with a failure."""
    root, _ = cifar10
    dirs = layout_dirs(tmp_path, "per_machine")
    slow = ["data._target_=tests.common.slow_data.SlowCifar10", "+data.batch_seconds=0.2"]

    def kill_worker(launchers):
        wait_for(dirs[0] / "checkpoints" / "trainkit-1_2.ckpt", launchers)
        pid = int((dirs[1] / "msrun_logs_node1" / "rank-1.pid").read_text())
        os.kill(pid, signal.SIGKILL)

    results = run_job(machines, root, dirs, tmp_path, *slow, "parallel.max_restarts=1", signal_when=kill_worker)
    for status, stdout, stderr in results:
        assert status == 0, stdout[-3000:] + stderr[-3000:]
    assert "restart 1 of parallel.max_restarts=1: worker rank 1 exited with status -9" in "".join(results[1][1:])
    assert "restart 1 of parallel.max_restarts=1: the job stopped on another machine: machine 1: worker rank 1 " \
           "exited with status -9" in "".join(results[0][1:])
    assert train_steps(dirs[0]) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert_same_checkpoint(dirs[0], whole)
    assert (dirs[0] / "msrun_logs-1").is_dir()  # the first attempt's logs are kept
    assert not processes_mentioning(str(dirs[0])) and not processes_mentioning(str(dirs[1]))


def test_worker_stop_statuses_are_not_restarted():
    """A worker that ended by SIGTERM/SIGINT was stopped on purpose (a scheduler's grace period): no restart."""
    from trainkit.distributed.launch import restartable
    from trainkit.distributed.msrun_job import _Failure

    assert restartable(1, [], _Failure(pid=1, status=-9), None)
    assert restartable(1, [], None, "the job stopped on another machine: x")
    assert not restartable(143, [], _Failure(pid=1, status=143), None)
    assert not restartable(143, [signal.SIGTERM], None, None)
    assert not restartable(0, [], None, None)


def test_a_signal_before_the_workers_joined_stops_the_job_at_once_and_after_is_forwarded(tmp_path):
    """Workers waiting in communication init run no signal handler: a launcher that forwarded SIGTERM to them
    waited up to msrun's 600 s. Before every joined-<rank> file, the signal ends the job at once; after, it goes to
    the workers. Mutation caught: without the joined check, the first SIGTERM was forwarded (no KeyboardInterrupt)."""
    import psutil

    from trainkit.distributed.msrun_job import _MsrunJob

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        job = _MsrunJob(command=[], env={}, shown_log=tmp_path / "worker_0.log", local_workers=1)
        job._seen[worker.pid] = psutil.Process(worker.pid)
        job._ranks[worker.pid] = "0"
        with pytest.raises(KeyboardInterrupt):
            job._on_signal(signal.SIGTERM, None)
        assert worker.poll() is None
        (tmp_path / "joined-0").write_text(str(worker.pid))
        job.signals.clear()
        job._on_signal(signal.SIGTERM, None)  # forwarded: the worker ends by it
        assert worker.wait(timeout=30) == -signal.SIGTERM
    finally:
        worker.kill()
        worker.wait()


# ------------------------------------------------------------------ the checkpoint machine 0 sends (fast: one host)
def checkpoint_transfer(tmp_path, announced: bytes, sent: bytes, already=None):
    """Machine 0 (a thread) announces a checkpoint by the sha256 of `announced` and sends the bytes `sent`;
    machine 1 (this thread) joins and prepares its own run directory, where `already` (bytes) may lie under the
    checkpoint's name. Returns (machine 1's MachineJob or its error, machine 0's error or its next message)."""
    import hashlib
    import threading

    from omegaconf import OmegaConf

    from trainkit.distributed.machines import _prepare
    from trainkit.distributed.rendezvous import Meeting
    from trainkit.rundir.lock import RunDirectoryLock

    port = free_port()
    parallel = {"nodes": 2, "workers": 1, "master_addr": "127.0.0.1", "master_port": port, "join_timeout": 30}
    host = Meeting(OmegaConf.create({**parallel, "node_rank": 0}), {"node_rank": 0, "signature": {}})
    guest = Meeting(OmegaConf.create({**parallel, "node_rank": 1}), {"node_rank": 1, "signature": {}})
    name = "trainkit-1_5.ckpt"
    run_dir = tmp_path / "machine1"
    run_dir.mkdir(parents=True)
    if already is not None:
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "checkpoints" / name).write_bytes(already)
    host_said = []

    def machine_0():
        try:
            host.gather()
            host.start({"job": "127.0.0.1:1/x", "checkpoint": {
                "name": name, "sha256": hashlib.sha256(announced).hexdigest()}}, sent)
            host_said.append(host.peers[1].receive(time.monotonic() + 30))  # what machine 1 says next
        except Exception as error:  # noqa: BLE001 -- handed to the test
            host_said.append(error)

    thread = threading.Thread(target=machine_0)
    thread.start()
    try:
        start = guest.join()
        with RunDirectoryLock(run_dir) as lock:
            try:
                outcome = _prepare(guest, lock, start, run_dir)
                guest.tell_done()  # the job machine 1 would run ended well
            except ConfigError as error:
                outcome = error
    finally:
        thread.join(timeout=60)
        guest.close()
        host.close()
    return outcome, host_said[0], run_dir / "checkpoints"


def test_machine_1_resumes_only_from_a_checkpoint_with_the_sha256_machine_0_sent(tmp_path):
    """Bytes that are not the file machine 0 announced (another checkpoint under its name, or a transfer that went
    wrong) are refused by the receiver in one line, before anything uses them: no file under the name, none
    partial, and machine 0 is told why. The announced bytes land and are resumed from.

    Mutation caught: _prepare writing the received bytes without comparing their sha256 (red: the other file is
    resumed from)."""
    checkpoint, other = b"machine 0's checkpoint" * 1000, b"another checkpoint" * 1000
    outcome, host_said, folder = checkpoint_transfer(tmp_path / "other", announced=checkpoint, sent=other)
    assert isinstance(outcome, ConfigError), outcome
    line = str(outcome)
    assert "\n" not in line and line.startswith("the checkpoint received from machine 0 as trainkit-1_5.ckpt has "
                                                "sha256 "), line
    assert "not used" in line
    assert not folder.exists() or not list(folder.iterdir())  # neither the file nor a .partial is left
    assert host_said == {"stop": f"machine 1: {line}"}  # machine 0 and the others stop, naming the cause

    job, host_said, folder = checkpoint_transfer(tmp_path / "same", announced=checkpoint, sent=checkpoint)
    assert not isinstance(job, Exception), job
    assert job.resume_path == str(folder / "trainkit-1_5.ckpt") and [p.name for p in folder.iterdir()] == [
        "trainkit-1_5.ckpt"]
    assert (folder / "trainkit-1_5.ckpt").read_bytes() == checkpoint
    assert host_said == {"done": True}


def test_another_file_already_under_the_checkpoint_s_name_is_refused_and_kept(tmp_path):
    """Machine 1's run directory holds a different file under the name machine 0 announces: refused in one line,
    before anything is sent; the file stays as it was, and machine 0 stops with the same line."""
    checkpoint, mine = b"machine 0's checkpoint" * 1000, b"machine 1's own file" * 1000
    outcome, host_said, folder = checkpoint_transfer(tmp_path, announced=checkpoint, sent=checkpoint, already=mine)
    assert isinstance(outcome, ConfigError) and "\n" not in str(outcome), outcome
    assert str(outcome).startswith(f"{folder / 'trainkit-1_5.ckpt'} is not machine 0's checkpoint of that name"), \
        outcome
    assert (folder / "trainkit-1_5.ckpt").read_bytes() == mine and len(list(folder.iterdir())) == 1
    assert isinstance(host_said, ConfigError) and str(host_said) == f"machine 1: {outcome}"
