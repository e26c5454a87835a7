"""``python -m trainkit.convert``: the entry point of :mod:`trainkit.bridge.convert`."""
import sys

from trainkit.bridge.convert import main

if __name__ == "__main__":
    sys.exit(main())
