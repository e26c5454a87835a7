"""``python -m trainkit.compare``: the entry point of :mod:`trainkit.bridge.compare`."""
import sys

from trainkit.bridge.compare import main

if __name__ == "__main__":
    sys.exit(main())
