"""Protocol Buffers' C backend (upb) for a command's process, where importing MindSpore would choose pure Python.

Importing MindSpore sets ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` when the variable is unset, against the
2 GiB message limit of protobuf's old C++ backend (its checkpoints are one message). upb, protobuf's default backend
since 4.21, has no such limit: a 2.16 GiB checkpoint saves and loads with it, as with pure Python. What pure Python
costs a run is every message trainkit writes: a record's TensorBoard event (``RunLog.scalars``: 143 us against 49
us with upb; 390 against 210 us inside the quick start's loop), and 0.1-0.2 s of a command's imports.

So ``python -m trainkit`` (and a project's command through :func:`trainkit.project.main`) and the tools' commands set
the variable to ``upb`` before anything imports MindSpore or protobuf, where it is unset and the installed protobuf has
upb; msrun's workers inherit it. A value in the environment is kept, and importing trainkit as a library changes
nothing (docs/performance.md).
"""
from __future__ import annotations

import importlib.util
import os
import sys

VARIABLE = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"


def _has_upb() -> bool:
    try:
        return importlib.util.find_spec("google._upb._message") is not None
    except (ImportError, ValueError):  # no google package, or a broken one
        return False


def choose_upb() -> bool:
    """Set the variable to ``upb`` for this process and its children; True when it did.

    Nothing when the variable is set already (the user's choice, or MindSpore's in a process that imported it), when
    protobuf is imported (its backend is chosen) or when the installed protobuf has no upb."""
    if VARIABLE in os.environ or "google.protobuf" in sys.modules or not _has_upb():
        return False
    os.environ[VARIABLE] = "upb"
    return True

