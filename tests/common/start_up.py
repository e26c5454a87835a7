"""Places a test holds a run of ``python -m trainkit`` at, to signal it there: the data preparation (start-up, past
Python's imports), the graph compile of the test-set evaluation (after the training loop), the teardown (an
``atexit`` function, after the "finished" line). Each writes a marker file, so the test knows the process is there."""
import atexit
import os
import time
import traceback
from pathlib import Path

from mindspore.ops import constexpr

from trainkit.data.digits import DigitsData
from trainkit.errors import DataError
from trainkit.models.small_cnn import SmallCNN


class PreparesUntilSignalled(DigitsData):
    def __init__(self, marker: str, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def prepare(self) -> None:
        Path(self.marker).write_text("preparing")
        deadline = time.monotonic() + 120  # a safety net: the test signals as soon as the marker is there
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise DataError("no signal came")


def _wait_for(marker: str, gate: str) -> None:
    """Write `marker`, then wait for `gate` (a safety net of 120 s: the test signals as soon as the marker is there)."""
    Path(marker).write_text("held")
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


@constexpr
def _held_in_the_test_set_compile(marker: str, gate: str) -> float:
    """Runs in Python while MindSpore compiles the graph that calls it (a constexpr); holds only the compile of the
    test-set evaluation, which runs after the training loop."""
    if any(frame.f_code.co_name == "evaluate_test_set" for frame, _ in traceback.walk_stack(None)):
        _wait_for(marker, gate)
    return 1.0


class CompilesUntilSignalled(SmallCNN):
    """The quick start's network; the compile of the test-set evaluation writes `marker` and waits for `gate`."""

    def __init__(self, marker: str, gate: str, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.gate = marker, gate

    def construct(self, x):
        return super().construct(x) * _held_in_the_test_set_compile(self.marker, self.gate)


class HeldAtExit(SmallCNN):
    """The quick start's network, and an ``atexit`` function that writes `marker` and waits for `gate`: it holds the
    process in its teardown, after the run's "finished" line."""

    def __init__(self, marker: str, gate: str, **kwargs):
        super().__init__(**kwargs)
        atexit.register(_wait_for, marker, gate)


@constexpr
def _held_in_an_export_compile() -> float:
    """Runs in Python while MindSpore compiles the graph that calls it; holds (the marker file named by
    ``TRAINKIT_TEST_COMPILE_MARKER`` written, up to 120 s) only the compiles of ``python -m trainkit.export``'s
    export_model, where a signal must end the command without a compiler dump."""
    marker = os.environ.get("TRAINKIT_TEST_COMPILE_MARKER")
    if marker and any(frame.f_code.co_name == "export_model" for frame, _ in traceback.walk_stack(None)):
        _wait_for(marker, marker + ".gate")
    return 1.0


class CompilesUntilSignalledInExport(SmallCNN):
    """The quick start's network (the same parameters: a run's checkpoint loads into it); its compiles inside an
    export write a marker and wait. Given as ``model._target_=`` to the tool, the marker by the environment, since
    the tool accepts changes of the saved config's keys only."""

    def construct(self, x):
        return super().construct(x) * _held_in_an_export_compile()
