"""The garbage collector while a command starts: paused through the imports and the config, then what exists frozen.

Importing MindSpore, Hydra and trainkit makes about 190,000 objects, and the collector would traverse them all three
times on the way (full collections as the heap grows): 0.3 s of CPU a command on the 2-core machine, 0.5-0.8 s of wall
time on a slow one (docs/performance.md). Those objects live as long as the process, and the cycles among them hold
about 1 MB. So ``python -m trainkit`` (and a project's command through :func:`trainkit.project.main`) pauses the
collector before its imports, and :func:`resume`, just before training (``trainkit/__main__.py``: the config
composed, the training code imported), freezes what exists -- frozen objects are never traversed again, not even by
the collection MindSpore runs before every graph compile -- and turns the collector back on.

The tools' commands (``python -m trainkit.predict``, ``.evaluate``, ``.export``, ``.compare``, ``.convert``,
``.port``) pause it around their entry module's imports only (:func:`paused_while_importing`): the same
three full collections, and their work then runs on a frozen start-up like the training command's.

Only a command's own process is paused: importing ``trainkit`` as a library changes nothing.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

_paused = False


def pause() -> None:
    """Stop automatic collections until :func:`resume` (nothing when the collector is off already)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Freeze every object that exists now, then collect automatically again, as before :func:`pause`.

    Idempotent; nothing when this module did not pause the collector (an in-process command, a test)."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False


def paused() -> bool:
    """Whether :func:`pause` stopped the collector and it has not resumed."""
    return _paused


@contextlib.contextmanager
def paused_while_importing(module_name: str) -> Iterator[None]:
    """Around a tool's entry-module imports: when the module runs as ``__main__`` (``python -m trainkit.predict``),
    no automatic collection inside the block, then :func:`resume`; imported as a library, nothing."""
    if module_name != "__main__":
        yield
        return
    pause()
    try:
        yield
    finally:
        resume()
