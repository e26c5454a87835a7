"""SIGTERM and SIGINT reach trainkit's command as what they are, and never in the middle of an import.

Without this module two things go wrong on ``python -m trainkit`` (DEVELOPERS.md, "Signals"):

- MindSpore's C++ ``SignalGuard`` answers a SIGINT with ``kill(getpid(), SIGTERM)`` once its runtime threads have
  installed it (they keep reinstalling it), so Ctrl-C reads as SIGTERM and ends with 143, not 130.
- A Python handler that raises runs at the next bytecode, wherever that is: inside ``import mindspore`` the
  exception breaks the C extension's initialisation (``ImportError: initialization failed`` in a Hydra traceback,
  or a "Fatal Python error" and exit 134 at exit), and before the command's handler exists SIGTERM kills the
  process without a word.

So :func:`route` blocks both signals in the calling (main) thread before anything starts a thread: every thread
created later, MindSpore's included, inherits the mask, and no C++ handler ever sees them. One thread of trainkit's
takes them (``sigtimedwait`` with a zero timeout, every 50 ms: :func:`_take` says why) and hands each to the main
thread's Python handler (``_thread.interrupt_main``, which runs that handler as if the signal had come), but only
once the main thread is outside any import: a signal during one waits for its end. :func:`unroute` puts everything
back (an in-process command, as in the tests). :func:`start` and :func:`finish` wrap a command: :func:`finish`
returns a signal that came while only the hold handlers were there, so that the command still ends as it.

A command that owns its process (``python -m trainkit``, not a test's in-process run) says so with
:func:`own_process`: from then on a signal that finds only the hold handler -- anywhere but the training loop,
whose ``SignalStop`` takes it politely: start-up, Hydra, compile, data preparation, the test-set evaluation -- ends
the process from the forwarding thread (its one line, 128 + N, ``os._exit``), never an exception at an arbitrary
bytecode of a library (an ``UnboundLocalError`` inside a ``try/finally``, MindSpore's ``analyze_fail.ir`` notice
inside a compile). Writes that must be whole first hold :func:`completing`; :func:`exit_process` ends the command
once its work is done, with Python's ``atexit`` functions run and MindSpore's C++ clean-up (the 0.6-1.2 s of
interpreter finalization in which a signal would be lost) skipped. A ``-m`` sweep's jobs take the signals as exceptions
again (:func:`stop_by_exception`): the sweep's launcher writes its summary on the way out.

A child inherits the mask: a forked one (``os.fork``: multiprocessing's workers) unblocks the signals at once, and a
command started with ``subprocess`` (msrun) is started inside :func:`unblocked`, else it would never see them.
"""
from __future__ import annotations

import _thread
import atexit
import contextlib
import os
import signal
import sys
import threading
import time

TYPE_CHECKING = False  # typing is not imported at run time: this module loads before the command's first imports
if TYPE_CHECKING:
    from typing import Callable, Iterator, List, NoReturn, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_ignored_at_start: set = set()  # of SIGNALS, those ignored (SIG_IGN) when start() ran
_POLL_SECONDS = 0.05  # how often the forwarding thread looks for a signal, and at a main thread that is importing
_IMPORTING = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")

_TEARDOWN_GRACE_SECONDS = 10.0  # a signal waits at most this long for exit_process's clean-up, then ends it anyway

_forwarder: Optional[threading.Thread] = None
_fork_hook = False
_stop = threading.Event()
_pending: List[int] = []  # taken by the forwarder, not yet delivered (under _taking: exit_process reads them)
_taking = threading.Lock()
_ending = threading.RLock()  # held by whoever ends the process, and by the main thread's writes (completing)
_farewell: Optional[Callable[[int, bool], None]] = None  # the owning command's one line (own_process)
_done = False  # the command's work is done: exit_process ends it
_stop_handler: Optional[Callable] = None  # the owning command's own handler (it raises): ended like the hold one
_by_exception = False  # a sweep's jobs: the command's handler raises, so that the launcher writes its summary


def route() -> bool:
    """Block SIGTERM and SIGINT here and in every later thread, and forward them from a thread of their own;
    returns whether routing is on (it needs the main thread and Python 3.10's ``interrupt_main(signum)``)."""
    global _forwarder
    if _forwarder is not None:
        return True
    if threading.current_thread() is not threading.main_thread() or sys.version_info < (3, 10):
        return False
    global _fork_hook
    if not _fork_hook:
        os.register_at_fork(after_in_child=_unblock_in_child)
        _fork_hook = True
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    _stop.clear()
    _forwarder = threading.Thread(target=_forward, args=(threading.main_thread().ident,),
                                  name="trainkit-signals", daemon=True)
    _forwarder.start()
    return True


def unroute() -> None:
    """Stop forwarding and unblock the signals in the calling thread (threads started meanwhile keep them
    blocked: a signal then goes to a thread that does not, the main one)."""
    global _forwarder
    if _forwarder is None:
        return
    _stop.set()
    _forwarder.join()
    _forwarder = None
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


@contextlib.contextmanager
def unblocked() -> Iterator[None]:
    """The signals unblocked in the calling thread meanwhile: start child processes inside it (they inherit the
    mask of the thread that starts them, through ``exec``); a signal in that moment reaches the Python handler."""
    if _forwarder is None:
        yield
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def _unblock_in_child() -> None:
    """A forked child has no forwarding thread: it takes its signals itself."""
    global _forwarder
    if _forwarder is not None:
        _forwarder = None
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def _forward(main_ident: int) -> None:
    pending = _pending
    while not _stop.is_set():
        with _taking:
            signum = _take()
            if signum is not None:
                pending.append(signum)
        if pending and _ends_process(pending[0]):
            _end_process(pending[0])  # never returns
        if len(pending) > 1 and _importing(main_ident):  # sent again while an import holds the first: at once
            _end_now(pending[-1])
        while pending and not _importing(main_ident) and not _ends_process(pending[0]):
            with _taking:
                delivered = pending.pop(0)
            _deliver(delivered)
        if signum is None:
            _stop.wait(_POLL_SECONDS)


def _ends_process(signum: int) -> bool:
    """Whether `signum` ends the process from this thread: the command owns it and only the hold handler is there
    (not the training loop's SignalStop, nor another handler that takes the signal politely)."""
    if _farewell is None or (_by_exception and not _done):
        return False
    handler = signal.getsignal(signum)
    return handler is _hold or (handler is _stop_handler and _stop_handler is not None)


def _take() -> Optional[int]:
    """A pending SIGTERM or SIGINT, taken, or None; never waits in the kernel. CPython's ``sigtimedwait`` with a
    timeout, interrupted (EINTR: a stop and continue, Ctrl-Z then ``fg``, a handled signal) after that timeout has
    passed, returns a siginfo nobody filled in: a garbage ``si_signo`` killed this thread and lost the signal
    (DEVELOPERS.md, "Signals"). With a zero timeout the kernel only looks, so that path is never taken."""
    info = signal.sigtimedwait(SIGNALS, 0)
    if info is None or info.si_signo not in SIGNALS:  # the check is for platforms that might still garble it
        return None
    if info.si_signo in _ignored_at_start:  # blocked, it was queued; ignored, it is dropped as it would have been
        return None
    return info.si_signo


def _importing(main_ident: int) -> bool:
    """Whether the main thread is inside an import (a frame of importlib's bootstrap on its stack)."""
    frame = sys._current_frames().get(main_ident)
    while frame is not None:
        if frame.f_code.co_filename in _IMPORTING:
            return True
        frame = frame.f_back
    return False


def _deliver(signum: int) -> None:
    handler = signal.getsignal(signum)
    if handler == signal.SIG_IGN:
        return
    if callable(handler):
        _thread.interrupt_main(signum)  # the main thread runs `handler` at its next bytecode
        return
    _end_now(signum)  # SIG_DFL (SignalStop's second signal sets it, then re-sends it)


def _end_process(signum: int) -> NoReturn:
    """End the owning command's process for `signum` from this thread: after the main thread's write in progress
    (:func:`completing`), with the command's one line, the log handlers flushed and held (no record half-written),
    exit status 128 + signum. Once :func:`exit_process` holds the process, it answers the signal itself, unless its
    clean-up takes longer than ``_TEARDOWN_GRACE_SECONDS`` (then this ends it)."""
    began = time.monotonic()
    while not _ending.acquire(timeout=_POLL_SECONDS):
        if _done and time.monotonic() - began > _TEARDOWN_GRACE_SECONDS:
            _exit_for(signum, done=True)
    _exit_for(signum, done=_done)


def _exit_for(signum: int, done: bool) -> NoReturn:
    try:
        if _farewell is not None:
            _farewell(signum, done)
        multiprocessing = sys.modules.get("multiprocessing")
        for child in multiprocessing.active_children() if multiprocessing is not None else ():
            child.terminate()  # what multiprocessing's atexit function would do, which os._exit skips
    finally:
        _flush()
        for path in list(_unfinished):  # last: the main thread runs on meanwhile, and may still create one
            with contextlib.suppress(OSError):
                os.unlink(path)
        os._exit(128 + signum)


_unfinished: set = set()  # files being written that a signal ending the process removes (removed_if_ended)


@contextlib.contextmanager
def removed_if_ended(path: str) -> Iterator[None]:
    """`path`, a temporary file being written, is removed if a signal ends the process from the forwarding thread
    meanwhile: ``os._exit`` skips the writer's own clean-up (its ``finally``)."""
    _unfinished.add(str(path))
    try:
        yield
    finally:
        _unfinished.discard(str(path))


_PHASES = "TRAINKIT_SIGNAL_PHASES"


def phase(name: str) -> None:
    """A test hook: with ``TRAINKIT_SIGNAL_PHASES`` set, a command says on stderr that it enters phase `name`
    (``trainkit: phase NAME``), so that a test sends a signal there on that message, not after a guessed sleep; set
    to ``hold:NAME``, it then waits there (up to two minutes) for the signal."""
    wanted = os.environ.get(_PHASES)
    if not wanted:
        return
    print(f"trainkit: phase {name}", file=sys.stderr, flush=True)
    if wanted == f"hold:{name}":
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_done and _pending):  # in exit_process: it answers the signal
            time.sleep(_POLL_SECONDS)


def _flush() -> None:
    """Flush the standard streams and every logging handler, and keep the handlers' locks: a record another
    thread is writing is finished first, and none starts before ``os._exit``."""
    logging = sys.modules.get("logging")  # not imported here: start() runs before the command's first imports
    for reference in list(logging._handlerList if logging is not None else ()):  # noqa: SLF001 -- as shutdown()
        handler = reference()
        if handler is not None and handler.lock is not None and handler.lock.acquire(timeout=1.0):
            with contextlib.suppress(Exception):
                handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _end_now(signum: int) -> None:
    """End the process as `signum`'s default action would (from the forwarding thread, which alone unblocks it)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    signal.pthread_kill(threading.get_ident(), signum)
    os._exit(128 + signum)  # only reached if a C handler (MindSpore's) took it instead


_held: List[int] = []
_original: dict = {}


def start() -> None:
    """What a command does first, before its imports: :func:`route`, and handlers that only record a signal
    (:func:`held`) until the command installs its own. :func:`finish` undoes both."""
    if _original or threading.current_thread() is not threading.main_thread():
        return
    _held.clear()
    # A signal the process was started with ignored stays ignored (a shell's background job ignores SIGINT so that
    # Ctrl-C reaches the foreground only; CPython keeps it so): routing blocks it, which would queue it instead.
    _ignored_at_start.clear()
    _ignored_at_start.update(signum for signum in SIGNALS if signal.getsignal(signum) is signal.SIG_IGN)
    _original.update({signum: signal.signal(signum, _hold) for signum in SIGNALS if signum not in _ignored_at_start})
    route()


def held() -> Optional[int]:
    """The first signal that came since :func:`start`, before the command's own handlers, or None (and None once
    :func:`finish` has answered it)."""
    return _held[0] if _held else None


def finish() -> Optional[int]:
    """Stop routing and put back the handlers :func:`start` found. Returns :func:`held` (None once finished): a
    signal that came while the command's own handlers were not in place, so that the command can still end as it."""
    global _farewell, _stop_handler, _by_exception
    _farewell, _stop_handler, _by_exception = None, None, False  # only an owning command ends without finish()
    if not _original:
        unroute()
        _pending.clear()
        return None
    unroute()  # a signal that is still pending reaches the hold handler here (signal.signal runs it first)
    # Taken by the forwarder and not yet delivered when it stopped (it holds one while the main thread imports, and
    # between taking and delivering): it came before the command's end all the same. Cleared unread, it was lost.
    _held.extend(_pending)
    _pending.clear()
    for signum, handler in _original.items():
        signal.signal(signum, handler)
    _original.clear()
    late = held()
    _held.clear()  # answered once: a later command in this process (a test's, a notebook's) starts without it
    return late


def _hold(signum, frame) -> None:
    _held.append(signum)


def start_command(*packages: str) -> None:
    """:func:`start`, if this process is ``python -m PACKAGE`` for one of `packages` (a package, or a module of
    one whose command takes the signals over, as trainkit's tools do): what the package's ``__init__`` calls, so that
    the signals are routed before anything else is imported (``python -m`` imports the package before its
    ``__main__``)."""
    if command_package() in packages:
        start()


def owned() -> bool:
    """Whether a command owns this process (:func:`own_process`): it ends with :func:`exit_process`."""
    return _farewell is not None


def command_package() -> Optional[str]:
    """The package (or module) this process was started to run with ``python -m``, or None (``python -c``, a
    script, the interpreter's own options only); ``sys.orig_argv`` is the interpreter's own command line, whose
    options end at ``-m``, ``-c``, ``-`` or the script, and where ``-W`` and ``-X`` take a value."""
    argv = list(getattr(sys, "orig_argv", []))[1:]
    while argv:
        argument = argv.pop(0)
        if argument == "--check-hash-based-pycs":
            argv[:1] = []
            continue
        if not argument.startswith("-") or argument in ("-", "--"):
            return None
        if argument.startswith("--"):
            continue
        for index, letter in enumerate(argument[1:], start=2):
            if letter in "mcWX":  # the rest of the cluster, or the next argument, is its value
                value = argument[index:] or (argv.pop(0) if argv else None)
                if letter == "m":
                    return value
                if letter == "c":
                    return None
                break
    return None


def stop_by_exception() -> None:
    """From now on until :func:`exit_process`, a signal outside the training loop reaches the command's handler
    (which raises) instead of ending the process: a sweep's launcher writes the summary of its jobs on the way out."""
    global _by_exception
    _by_exception = True


def own_process(farewell: Callable[[int, bool], None], stop_handler: Optional[Callable] = None) -> bool:
    """The command owns this process: from now on a signal that finds only the hold handler (or `stop_handler`, the
    command's own, which would raise) ends the process from the forwarding thread, after ``farewell(signum, done)``
    (the command's one line; ``done``: its work was done) and with exit status 128 + signum. Returns whether that is
    on (it needs :func:`start`'s routing)."""
    global _farewell, _stop_handler
    if _forwarder is None or not _original:
        return False
    _farewell, _stop_handler = farewell, stop_handler
    if _held:  # came before: the hold handler kept it, nothing of the command's has run yet
        _exit_for(_held[0], done=False)
    return True


@contextlib.contextmanager
def completing() -> Iterator[None]:
    """A write that must be whole: a signal that would end the process waits for the end of it."""
    with _ending:
        yield


def exit_process(status: int) -> NoReturn:
    """End the owning command's process once its work is done: Python's ``atexit`` functions (``logging``'s
    shutdown, MindSpore's asynchronous checkpoint save and summary close, ``multiprocessing``'s children), the
    standard streams flushed, then ``os._exit``, skipping the interpreter's finalization (module clean-up,
    MindSpore's C++ destructors: 0.6-1.2 s in which a signal would be lost or kill the process as -15). A signal that
    came meanwhile, or before, ends it as 128 + N with the farewell saying the work was done."""
    global _done
    with _ending:  # the forwarder, if it is ending the process already, finishes that first
        _done = True
        try:
            threading._shutdown()  # noqa: SLF001 -- what finalization does first: wait for non-daemon threads
            atexit._run_exitfuncs()  # noqa: SLF001
        finally:
            _flush()  # before the last look: a signal taken after it has microseconds to land, not a flush's time
            with _taking:
                signum = _pending[0] if _pending else (_held[0] if _held and not status else _take())
                if signum is None:
                    os._exit(status)
            _exit_for(signum, done=True)


def exit_status(code: object) -> int:
    """The status Python gives ``sys.exit(code)``: None is 0, a number itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
