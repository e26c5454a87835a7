"""``python -m trainkit.evaluate``: the entry point of :mod:`trainkit.tools.evaluate`."""
import sys

from trainkit.tools.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
