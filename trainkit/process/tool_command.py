"""How a tool's command starts and ends (``python -m trainkit.predict``, ``.evaluate``, ``.export``, ``.compare``,
``.convert``, ``.port``).

It starts as the training command does (:func:`importing`): protobuf on its C backend
(``trainkit.process.protobuf_backend``) and no full garbage collection through the imports
(``trainkit.process.startup_gc``). It ends with its ``main()``'s exit status, or with one line for what is not the
tool's fault (:func:`tool_status`):

- A full disk (or quota): ``trainkit: error: FILE could not be written: the disk is full (...)``, status 1. The
  tools write each output under a temporary name renamed into place (``trainkit.rundir.output_file``), removed when
  a write fails, so nothing partial is left.
- SIGTERM or SIGINT, at any moment (the imports, building the network, MindSpore's compile, the write, the check
  of what was written): ``trainkit: stopped by SIGTERM: nothing was written (an output written before it is
  whole)``, 128 + N; after the tool's work was done, ``trainkit: stopped by SIGTERM after the command had done its
  work (what it wrote is whole)``, 128 + N.

``python -m trainkit.<tool>`` owns its process as the training command does (:mod:`trainkit.process.signals`): the
signals are blocked in every thread from the package's first import (MindSpore's C++ guard never sees one, so none is
lost and Ctrl-C stays SIGINT) and one thread of trainkit's ends the process: its line, the temporary file of the output
being written removed (``trainkit.rundir.output_file``), ``os._exit(128 + N)`` -- never an exception raised at an
arbitrary bytecode, which inside MindSpore's compile left its ``rank_0/om/analyze_fail.ir`` dump behind. The tool
ends through :func:`trainkit.process.signals.exit_process` (no interpreter finalization, where a signal was lost and the
command exited 0). Run in-process (tests, a notebook), a signal raises in the main thread instead, so the writes'
clean-up (``finally``) runs.
"""
from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import traceback
from typing import Callable, Iterator

from trainkit.errors import disk_full
from trainkit.process import protobuf_backend, signals, startup_gc

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Stopped(BaseException):
    """A signal, as an exception: a BaseException, so no ``except Exception`` of a tool's takes it for an error."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame) -> None:
    raise _Stopped(signum)


@contextlib.contextmanager
def importing(module_name: str) -> Iterator[None]:
    """Around a tool's entry-module imports: when the module runs as ``__main__`` (``python -m``), protobuf's C
    backend chosen before MindSpore picks Python, and no full collection inside the block; imported as a library,
    nothing."""
    if module_name == "__main__":
        _own_process()  # first: a signal during the imports below ends the command with its line
        signals.phase("import")
        protobuf_backend.choose_upb()
    with startup_gc.paused_while_importing(module_name):
        yield


_STOPPED = "stopped by {}: nothing was written (an output written before it is whole)"
_STOPPED_DONE = "stopped by {} after the command had done its work (what it wrote is whole)"


def _farewell(signum: int, done: bool) -> None:
    """The one line of a signal that ends a tool's command (called from trainkit.process.signals' thread)."""
    message = (_STOPPED_DONE if done else _STOPPED).format(signal.Signals(signum).name)
    print(f"trainkit: {message}", file=sys.stderr, flush=True)


def _own_process() -> None:
    """``python -m trainkit.<tool>``: the signals routed (the package's ``__init__`` did it already) and owned."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name and signals.command_package() == name and threading.current_thread() is threading.main_thread():
        signals.start()
        signals.own_process(_farewell, _stop)


def tool_status(main: Callable[[], int]) -> int:
    """Run a tool's `main` as its command does; returns the exit status (see the module's docstring). A command
    that owns its process (``python -m trainkit.<tool>``) ends here, with that status, through
    :func:`trainkit.process.signals.exit_process`."""
    if signals.owned():
        try:
            status = _status(main)
        except SystemExit as end:  # argparse's --help and its usage errors
            status = _exit_status(end.code)
        except BaseException:  # a crash: its traceback, then status 1, as Python's own exit would
            traceback.print_exc()
            status = 1
        atexit.register(signals.phase, "teardown")  # the first to run in exit_process; a no-op outside the tests
        signals.exit_process(status)
    return _status(main)


_exit_status = signals.exit_status  # the status sys.exit(code) gives


def _status(main: Callable[[], int]) -> int:
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, _stop) for signum in _SIGNALS
                    if signal.getsignal(signum) is not signal.SIG_IGN}  # a background job's ignored SIGINT stays so
    try:
        return main()
    except OSError as error:
        if not disk_full(error):
            raise
        print(f"trainkit: error: {error.filename or 'the output'} could not be written: the disk is full "
              f"({error.strerror}); nothing partial was left", file=sys.stderr)
        return 1
    except _Stopped as stop:
        print(f"trainkit: stopped by {stop}: nothing was written (an output written before it is whole)",
              file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
