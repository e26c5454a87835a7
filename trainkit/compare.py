"""``python -m trainkit.compare``: the entry point of :mod:`trainkit.bridge.compare`."""
import sys

from trainkit.process.tool_command import importing, tool_status

with importing(__name__):  # python -m: protobuf's C backend, no full collection in the imports
    from trainkit.bridge.compare import main

if __name__ == "__main__":
    sys.exit(tool_status(main))  # a full disk or a signal: one line
