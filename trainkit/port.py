"""``python -m trainkit.port``: the entry point of :mod:`trainkit.bridge.port`."""
import sys

from trainkit.bridge.port import main

if __name__ == "__main__":
    sys.exit(main())
