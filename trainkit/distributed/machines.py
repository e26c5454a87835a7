"""One job on several machines: the launchers meet (:mod:`trainkit.distributed.rendezvous`), then each prepares its
run directory for the job.

Two layouts work:

* **one shared run directory** (a shared file system): machine 0's launcher holds the directory's lock for the
  job, named ``<master_addr>:<master_port>/<nonce>``; another machine's launcher that finds the lock held for that
  same job shares the directory (its workers write nothing there but their msrun logs, in ``msrun_logs_node<R>/``).
  A directory held by anything else is refused, as on one machine.
* **a run directory per machine**: every launcher holds its own directory's lock. When the job resumes, machine 0
  sends the checkpoint its rank 0 resumes from to every machine that lacks it, with its sha256; it lands in that
  machine's ``checkpoints/`` under the same name (never over a different file), once the file written there has the
  sha256 machine 0 sent (else the job stops with one line, and the file is not kept), and the machine's workers
  resume from it.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from omegaconf import DictConfig

from trainkit.distributed.agreement import start_signature
from trainkit.distributed.rendezvous import Meeting
from trainkit.errors import ConfigError, RunDirectoryInUse
from trainkit.rundir.checkpoint_file import find_resume_checkpoint
from trainkit.rundir.lock import RunDirectoryLock, held_for_job

log = logging.getLogger("trainkit")


@dataclass
class MachineJob:
    """This machine's part of the job, once the machines met."""

    meeting: Meeting
    lock: RunDirectoryLock  # held, unless the run directory is shared with machine 0
    resume_path: Optional[str] = None  # the checkpoint machine 0 resumes from, in this machine's own run directory
    shared: bool = False  # the run directory is machine 0's too


def log_dir_name(node_rank: int, nodes: int) -> str:
    """msrun's log folder of this machine in the run directory: one per machine, so a shared directory works."""
    return "msrun_logs" if nodes == 1 or node_rank == 0 else f"msrun_logs_node{node_rank}"


@contextlib.contextmanager
def meet(cfg: DictConfig, run_dir: Path, resume: Optional[str], attempt: int = 0) -> Iterator[MachineJob]:
    """Meet the job's other machines' launchers and prepare this machine's run directory; leave: release all.

    Raises:
        PeersMissing: machines that did not join within ``parallel.join_timeout``.
        ConfigError: a machine runs another config; RunDirectoryInUse: the run directory holds another run.
    """
    parallel = cfg.parallel
    signature = {name: value for name, value in start_signature(0, [], cfg).items() if name.startswith("config ")}
    meeting = Meeting(parallel, {"node_rank": parallel.node_rank, "host": socket.gethostname(),
                                 "signature": signature, "attempt": attempt})
    try:
        if meeting.hosting:
            job = f"{parallel.master_addr}:{parallel.master_port}/{uuid.uuid4().hex}"
            with RunDirectoryLock(run_dir, job=job) as lock:
                lock.acquire()  # first: a machine joining then finds it held for this job
                meeting.gather()
                checkpoint = find_resume_checkpoint(str(resume), run_dir) if resume is not None else None
                payload = checkpoint.path.read_bytes() if checkpoint is not None else None
                meeting.start({"job": job, "checkpoint": None if payload is None else {
                    "name": checkpoint.path.name, "sha256": hashlib.sha256(payload).hexdigest()}}, payload)
                yield MachineJob(meeting, lock)
        else:
            start = meeting.join()
            with RunDirectoryLock(run_dir) as lock:
                yield _prepare(meeting, lock, start, run_dir)
    finally:
        meeting.close()


def _prepare(meeting: Meeting, lock: RunDirectoryLock, start: dict, run_dir: Path) -> MachineJob:
    """Another machine: take its run directory (or share machine 0's), and get the checkpoint to resume from."""
    try:
        try:
            lock.acquire()
            shared = False
        except RunDirectoryInUse:
            if not held_for_job(run_dir, start["job"]):
                raise
            shared = True
        checkpoint, resume_path, need = start.get("checkpoint"), None, False
        if checkpoint and not shared:
            target = run_dir / "checkpoints" / checkpoint["name"]
            if target.exists() and _sha256(target) != checkpoint["sha256"]:
                raise ConfigError(f"{target} is not machine 0's checkpoint of that name, which this machine must "
                                  "resume from: nothing was changed there; move it away, or give this machine a new "
                                  "run directory (hydra.run.dir=PATH)")
            need, resume_path = not target.exists(), str(target)
    except (ConfigError, OSError) as error:
        meeting.refuse(ConfigError(f"machine {meeting.parallel.node_rank}: {error}"))
        raise
    began = time.perf_counter()
    data = meeting.answer(need)
    if data is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(data)
        received = _sha256(partial)  # the file as written here, not the bytes in memory: what the workers load
        if received != checkpoint["sha256"]:
            partial.unlink()
            error = ConfigError(
                f"the checkpoint received from machine 0 as {checkpoint['name']} has sha256 {received[:16]}..., not "
                f"the {checkpoint['sha256'][:16]}... machine 0 sent: it was not used, nor kept in {target.parent}; "
                "start the job again (a second transfer), or copy machine 0's checkpoints/ here")
            # machine 0 has started its job: it and the other machines stop it, naming this cause
            meeting.tell_stop(f"machine {meeting.parallel.node_rank}: {error}")
            raise error
        os.replace(partial, target)
        log.info("received machine 0's checkpoint %s (%.1f MB) in %.3f s, its sha256 that machine 0 sent: this "
                 "machine resumes from it", target, len(data) / 1e6, time.perf_counter() - began)
    return MachineJob(meeting, lock, resume_path, shared)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
