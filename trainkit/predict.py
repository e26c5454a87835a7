"""``python -m trainkit.predict``: the entry point of :mod:`trainkit.tools.predict`."""
import sys

from trainkit.tools.predict import main

if __name__ == "__main__":
    sys.exit(main())
