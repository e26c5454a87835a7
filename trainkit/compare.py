"""``python -m trainkit.compare``: the entry point of :mod:`trainkit.bridge.compare`."""
import sys

from trainkit import protobuf_backend, startup_gc
from trainkit.tool_command import tool_status

protobuf_backend.choose_upb_for(__name__)  # python -m: protobuf's C backend, before MindSpore picks Python

with startup_gc.paused_while_importing(__name__):  # python -m: no full collection in the imports
    from trainkit.bridge.compare import main

if __name__ == "__main__":
    sys.exit(tool_status(main))  # a full disk or a signal: one line
