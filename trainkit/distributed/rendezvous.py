"""The launchers of one multi-machine job meet before msrun starts, and stay in touch while it runs.

Machine 0's launcher listens on ``parallel.master_port + 1`` (msrun's scheduler has ``master_port``); every other
machine's launcher connects to it. Meeting first gives what msrun alone cannot:

* a node whose peers do not come stops after ``parallel.join_timeout`` with one line naming the missing machines,
  their ranks, the address and the port (msrun's scheduler waits silently, and its workers ignore signals then);
* the machines compare their decisive config before any process starts (:mod:`trainkit.distributed.agreement`);
* each machine learns machine 0's job name, so a launcher on a shared file system can tell machine 0's lock on the
  run directory (the same job: share it) from another run's (refused), and machine 0 can send the checkpoint it
  resumes from to machines with a run directory of their own;
* while the job runs, a launcher whose job ends with a failure (or that is gone: its connection closes) makes
  every other launcher stop its workers at once, instead of leaving them in a collective that never completes.

Messages are JSON lines, a file's bytes follow the line that announces their size. Every wait polls in short
slices, so a signal handler runs at once (the launcher stops in any phase).
"""
from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from trainkit.errors import ConfigError, TrainingError

log = logging.getLogger("trainkit")

PORT_OFFSET = 1  # the rendezvous port is parallel.master_port + 1
_SLICE = 0.2  # seconds: the longest a wait blocks before signals are looked at again


class PeersMissing(TrainingError):
    """Peers did not join within ``parallel.join_timeout``; the message names them, the address and the port."""


@dataclass
class _Connection:
    """One TCP connection carrying JSON lines (and announced bytes)."""

    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)  # amortised appends: a checkpoint comes in many chunks
    done: bool = False  # its job ended well: the connection closing then is no failure

    def send(self, message: Dict[str, Any], payload: bytes = b"") -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(json.dumps(message).encode() + b"\n" + payload)

    def _fill(self, deadline: Optional[float]) -> bool:
        """Read what has come; False when the peer closed the connection. TimeoutError past `deadline`."""
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError
            ready, _, _ = select.select([self.sock], [], [], _SLICE)
            if ready:
                try:
                    chunk = self.sock.recv(4 << 20)
                except OSError:
                    return False
                if not chunk:
                    return False
                self.buffer += chunk
                return True

    def receive(self, deadline: Optional[float]) -> Optional[Dict[str, Any]]:
        """The next message, or None when the connection closed first."""
        while b"\n" not in self.buffer:
            if not self._fill(deadline):
                return None
        end = self.buffer.index(b"\n")
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        return json.loads(line)

    def receive_bytes(self, size: int, deadline: Optional[float]) -> Optional[bytes]:
        while len(self.buffer) < size:
            if not self._fill(deadline):
                return None
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def poll(self) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Without waiting: (closed, a complete message if one has come)."""
        ready, _, _ = select.select([self.sock], [], [], 0)
        if ready:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                return True, None
            self.buffer += chunk
        if b"\n" in self.buffer:
            end = self.buffer.index(b"\n")
            line = bytes(self.buffer[:end])
            del self.buffer[:end + 1]
            return False, json.loads(line)
        return False, None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _ranks(node_rank: int, workers: int) -> str:
    first = node_rank * workers
    return str(first) if workers == 1 else f"{first}-{first + workers - 1}"


@dataclass
class Meeting:
    """This launcher's side of the job's meeting: machine 0 hosts it, the others join it.

    Args:
        parallel: the ``parallel`` config node (nodes, node_rank, workers, master_addr, master_port, join_timeout).
        hello: what this machine tells machine 0 (its config signature...); machine 0's own for comparison.
    """

    parallel: Any
    hello: Dict[str, Any]
    peers: Dict[int, _Connection] = field(default_factory=dict)  # machine 0: node rank -> connection
    host_connection: Optional[_Connection] = None  # the others: to machine 0
    _listener: Optional[socket.socket] = None

    @property
    def address(self) -> str:
        return f"{self.parallel.master_addr}:{self.parallel.master_port + PORT_OFFSET}"

    @property
    def hosting(self) -> bool:
        return self.parallel.node_rank == 0

    def _timeout_text(self) -> str:
        return f"within parallel.join_timeout={self.parallel.join_timeout:g}s"

    # ------------------------------------------------------------------ machine 0
    def gather(self) -> Dict[int, Dict[str, Any]]:
        """Machine 0: wait for every other machine's hello; their hellos by node rank.

        Raises:
            PeersMissing: some did not come in time (the joined ones are told the same line).
            ConfigError: a machine's config differs (every joined machine is told).
        """
        deadline = time.monotonic() + self.parallel.join_timeout
        listener = self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", self.parallel.master_port + PORT_OFFSET))
        except OSError as error:
            raise ConfigError(f"parallel.master_port={self.parallel.master_port}: the launcher's port "
                              f"{self.parallel.master_port + PORT_OFFSET} (master_port + 1) of this machine is taken "
                              f"({error.strerror}): choose another parallel.master_port on every machine") from None
        listener.listen(16)
        log.info("waiting up to %gs (parallel.join_timeout) for machine(s) %s at %s", self.parallel.join_timeout,
                 ", ".join(str(r) for r in range(1, self.parallel.nodes)), self.address)
        hellos: Dict[int, Dict[str, Any]] = {}
        pending: List[_Connection] = []
        while len(hellos) < self.parallel.nodes - 1:
            if time.monotonic() > deadline:
                missing = [r for r in range(1, self.parallel.nodes) if r not in hellos]
                self._abort(PeersMissing(
                    f"machine(s) {', '.join(map(str, missing))} (rank(s) "
                    f"{', '.join(_ranks(r, self.parallel.workers) for r in missing)}) did not join "
                    f"{self._timeout_text()} at {self.address} (machine 0's launcher; msrun's scheduler would be at "
                    f"port {self.parallel.master_port}): start them with the same command and parallel.node_rank=R, "
                    "and check that this address and both ports are reachable from them"))
            ready, _, _ = select.select([listener] + [c.sock for c in pending], [], [], _SLICE)
            if listener in ready:
                sock, _ = listener.accept()
                pending.append(_Connection(sock))
            for connection in [c for c in pending if c.sock in ready]:
                closed, message = connection.poll()
                if closed:
                    pending.remove(connection)
                    connection.close()
                elif message is not None:
                    pending.remove(connection)
                    self._welcome(connection, message, hellos)
        for connection in pending:
            connection.close()
        listener.close()  # a launcher that restarts must not queue on this meeting's port: it waits for the next
        self._listener = None
        return hellos

    def _welcome(self, connection: _Connection, hello: Dict[str, Any], hellos: Dict[int, Dict[str, Any]]) -> None:
        rank = hello.get("node_rank")
        if not isinstance(rank, int) or not 1 <= rank < self.parallel.nodes or rank in self.peers:
            connection.send({"refused": f"machine 0 at {self.address} already has a machine with parallel.node_rank="
                                        f"{rank}, or expects node ranks 1..{self.parallel.nodes - 1}"})
            connection.close()
            return
        self.peers[rank], hellos[rank] = connection, hello
        differing = [name for name, value in self.hello.get("signature", {}).items()
                     if hello.get("signature", {}).get(name) != value]
        if differing:
            self._abort(ConfigError(f"machine {rank} ({hello.get('host')}) runs another config than machine 0: its "
                                    f"{', '.join(name.replace('config ', '') for name in differing)} differ(s); "
                                    "give every machine the same command but parallel.node_rank"))

    def _abort(self, error: Exception) -> None:
        for connection in self.peers.values():
            connection.send({"abort": str(error), "kind": type(error).__name__})
        raise error

    def start(self, start: Dict[str, Any], payload: Optional[bytes]) -> None:
        """Machine 0: tell every machine to start; send `payload` (a checkpoint) to those that ask for it."""
        deadline = time.monotonic() + self.parallel.join_timeout
        for connection in self.peers.values():
            connection.send({"start": start})
        for rank, connection in self.peers.items():
            try:
                reply = connection.receive(deadline)
            except TimeoutError:
                reply = None
            if reply is None:
                self._abort(PeersMissing(f"machine {rank} left before the job started ({self.address})"))
            if reply.get("abort"):
                self._abort(_error(reply))
            if reply.get("need") and payload is not None:
                connection.send({"bytes": len(payload)}, payload)

    # ------------------------------------------------------------------ the other machines
    def join(self) -> Dict[str, Any]:
        """Another machine: connect to machine 0, say hello, wait for the start; what machine 0 said.

        Raises:
            PeersMissing: machine 0 did not answer in time, or said that other machines are missing.
            ConfigError: machine 0 found that this machine's config differs.
        """
        deadline = time.monotonic() + self.parallel.join_timeout
        host, port = self.parallel.master_addr, self.parallel.master_port + PORT_OFFSET
        missing = PeersMissing(f"machine 0 (rank(s) {_ranks(0, self.parallel.workers)}) did not answer "
                               f"{self._timeout_text()} at {self.address} (its launcher's port, master_port + 1): "
                               "start it with the same command and parallel.node_rank=0, and check that this address "
                               "is reachable from here")
        log.info("joining machine 0 at %s (waiting up to %gs, parallel.join_timeout)", self.address,
                 self.parallel.join_timeout)
        while True:
            if time.monotonic() > deadline:
                raise missing
            try:
                sock = socket.create_connection((host, port), timeout=_SLICE)
            except OSError:
                time.sleep(_SLICE)  # nobody listens yet: machine 0 has not started (polling, not synchronising)
                continue
            sock.settimeout(None)
            self.host_connection = _Connection(sock)
            self.host_connection.send(self.hello)
            try:  # machine 0 answers by its own deadline; this one's is a backstop
                message = self.host_connection.receive(deadline + self.parallel.join_timeout)
            except TimeoutError:
                raise missing from None
            if message is None:  # an earlier meeting's port, closing: try the next one
                self.host_connection.close()
                self.host_connection = None
                continue
            if "start" not in message:
                raise _error(message)
            return message["start"]

    def answer(self, need: bool) -> Optional[bytes]:
        """Another machine: tell machine 0 whether it needs the checkpoint; its bytes if so."""
        self.host_connection.send({"need": need})
        if not need:
            return None
        deadline = time.monotonic() + max(60.0, self.parallel.join_timeout)
        header = self.host_connection.receive(deadline)
        data = self.host_connection.receive_bytes(header["bytes"], deadline) if header else None
        if data is None:
            raise PeersMissing(f"machine 0's launcher at {self.address} closed the connection while sending its "
                               "checkpoint")
        return data

    def refuse(self, error: Exception) -> None:
        """Another machine: it cannot start (its run directory is taken...): machine 0 and the others stop too."""
        if self.host_connection is not None:
            self.host_connection.send({"abort": str(error), "kind": type(error).__name__})

    # ------------------------------------------------------------------ while the job runs
    def stopped_elsewhere(self) -> Optional[str]:
        """Without waiting: why another machine's job ended early (a failure, a lost launcher), or None."""
        connections = self.peers.items() if self.hosting else [(0, self.host_connection)]
        for rank, connection in connections:
            if connection is None or connection.done:
                continue
            closed, message = connection.poll()
            if closed:
                return f"machine {rank}'s launcher is gone (its connection to {self.address} closed)"
            if message is not None and message.get("done"):
                connection.done = True
            if message is not None and message.get("stop"):
                return message["stop"]
        return None

    def tell_done(self) -> None:
        """This machine's job ended well: its connections closing next is no reason for the others to stop."""
        for connection in (self.peers.values() if self.hosting else [self.host_connection]):
            if connection is not None:
                connection.send({"done": True})

    def tell_stop(self, cause: str) -> None:
        """This machine's job ended early: every other machine stops its workers too (machine 0 passes it on)."""
        connections = self.peers.values() if self.hosting else [self.host_connection]
        for connection in connections:
            if connection is not None:
                connection.send({"stop": cause})

    def close(self) -> None:
        for connection in [*self.peers.values(), self.host_connection]:
            if connection is not None:
                connection.close()
        if self._listener is not None:
            self._listener.close()


def _error(message: Dict[str, Any]) -> Exception:
    """The error another machine stopped the meeting with, as this machine raises it."""
    text = message.get("abort") or message.get("refused") or f"unexpected message from machine 0: {message}"
    return PeersMissing(text) if message.get("kind") == "PeersMissing" else ConfigError(text)
