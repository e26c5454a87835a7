"""``python -m trainkit.export``: the entry point of :mod:`trainkit.tools.export`."""
import sys

from trainkit.tools.export import main

if __name__ == "__main__":
    sys.exit(main())
