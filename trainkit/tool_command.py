"""How a tool's command starts and ends (``python -m trainkit.predict``, ``.evaluate``, ``.export``, ``.compare``,
``.convert``, ``.port``).

It starts as the training command does (:func:`importing`): protobuf on its C backend
(``trainkit.protobuf_backend``) and no full garbage collection through the imports (``trainkit.startup_gc``). It ends
with its ``main()``'s exit status, or with one line for what is not the tool's fault (:func:`tool_status`):

- A full disk (or quota): ``trainkit: error: FILE could not be written: the disk is full (...)``, status 1. The
  tools write each output under a temporary name renamed into place (``trainkit.rundir.output_file``), removed when
  a write fails, so nothing partial is left.
- SIGTERM or SIGINT: ``trainkit: stopped by SIGTERM: nothing was written``, 128 + N. Without this the default
  SIGTERM ended the process where it stood, leaving the temporary file of the output being written beside it
  (``.model.onnx.<pid>.tmp.onnx``), and Ctrl-C was a KeyboardInterrupt traceback (or MindSpore's C++ guard turned
  it into a silent SIGTERM). The signal raises in the main thread, so the writes' clean-up (``finally``) runs.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Callable, Iterator

from trainkit import protobuf_backend, startup_gc
from trainkit.errors import disk_full

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
        protobuf_backend.choose_upb()
    with startup_gc.paused_while_importing(module_name):
        yield


def tool_status(main: Callable[[], int]) -> int:
    """Run a tool's `main` as its command does; returns the exit status (see the module's docstring)."""
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
