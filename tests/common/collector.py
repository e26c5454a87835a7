"""A network that says, when the app builds it, what the garbage collector has done in the process so far."""
import gc
import json
from pathlib import Path

from trainkit.models.small_cnn import SmallCNN


class RecordsTheCollector(SmallCNN):
    """The quick start's network; built, it writes the collector's state to `record` (JSON): whether it collects,
    how many objects are frozen, and how many full collections ran since the interpreter started."""

    def __init__(self, record: str, **kwargs):
        super().__init__(**kwargs)
        Path(record).write_text(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                                            "full_collections": gc.get_stats()[2]["collections"]}))
