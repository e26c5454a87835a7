"""Holds an import half-way, so a test can signal a process inside it (on PYTHONPATH as sitecustomize).

When the module named by TRAINKIT_TEST_IMPORT_HOLD (``hydra``: the first import of ``python -m trainkit``'s own
module; ``mindspore._c_expression``: inside ``import mindspore``) is about to be imported, the finder writes the
file named by TRAINKIT_TEST_IMPORT_MARKER, then waits for the file named by TRAINKIT_TEST_IMPORT_GATE, which the
test writes right after its signal. Then the import goes on as usual.
"""
import os
import sys
import time

_HOLD = os.environ.get("TRAINKIT_TEST_IMPORT_HOLD")
_MARKER, _GATE = os.environ.get("TRAINKIT_TEST_IMPORT_MARKER"), os.environ.get("TRAINKIT_TEST_IMPORT_GATE")


class _Gate:
    held = False

    def find_spec(self, name, path=None, target=None):
        if name == _HOLD and not _Gate.held:
            _Gate.held = True
            with open(_MARKER, "w") as marker:
                marker.write("importing")
            deadline = time.monotonic() + 240  # a safety net: the test writes the gate right after its signal
            while not os.path.exists(_GATE) and time.monotonic() < deadline:
                time.sleep(0.01)
        return None  # the usual finders import it


if _HOLD and _MARKER and _GATE:
    sys.meta_path.insert(0, _Gate())
