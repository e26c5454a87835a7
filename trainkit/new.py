"""``python -m trainkit.new NAME [FOLDER]``: the entry point of :mod:`trainkit.project.scaffold`, which writes a
project that trains out of the box with its own command (docs/your-project.md)."""
import sys

from trainkit.project.scaffold import main, write_project  # noqa: F401 - trainkit.new.write_project, documented

if __name__ == "__main__":
    sys.exit(main())
