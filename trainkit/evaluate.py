"""``python -m trainkit.evaluate``: the entry point of :mod:`trainkit.tools.evaluate`."""
import sys

from trainkit import startup_gc

with startup_gc.paused_while_importing(__name__):  # python -m: no full collection in the imports
    from trainkit.tools.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
