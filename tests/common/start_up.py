"""A data module that is still preparing when a test signals the run: it writes `marker` (so the test knows the
process is in its start-up, past Python's imports) and then waits for the signal."""
import time
from pathlib import Path

from trainkit.data.digits import DigitsData
from trainkit.errors import DataError


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
