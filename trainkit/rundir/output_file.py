"""Outputs written whole or not at all: under a temporary name beside the output, then renamed into place.

A write that fails -- a full disk, an error of the code that makes the content, a check that refuses it -- removes
the temporary file, so neither a partial output nor a stray file is left, and a full disk's error names the output
asked for, not the temporary name (the command's one line says which file). A signal that ends a tool's command
(``trainkit.process.tool_command``) removes it too.

A CSV cell a spreadsheet would run as a formula is written as text (:func:`spreadsheet_text`).
"""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence, Union

from trainkit.errors import disk_full
from trainkit.process import signals

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_FORMULA_SET = frozenset(FORMULA_STARTS)
_CELL_SEPARATOR = "\x1f"
_A_CELL_STARTS_FORMULA = re.compile(f"(?:^|{_CELL_SEPARATOR})[=+\\-@\t\r]")
_PLAIN_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", re.ASCII)


@contextlib.contextmanager
def written_whole(output: Union[str, Path], suffix: str = "") -> Iterator[Path]:
    """Yields the temporary path to write (``.<name>.<pid>.tmp<suffix>`` beside `output`); when the block ends
    without an error, what it wrote there replaces `output` -- nothing, if the block removed or never made the file.

    `suffix`: for writers that insist on one (MindSpore's checkpoint and export add theirs to a name without it).
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.{os.getpid()}.tmp{suffix}")
    try:
        temporary.unlink(missing_ok=True)  # a file or link planted under the name: its target is not written through
        with signals.removed_if_ended(temporary):  # a tool's command ended by a signal skips the finally below
            yield temporary
            if temporary.exists():
                os.replace(temporary, output)
    except OSError as error:
        if disk_full(error):
            raise OSError(error.errno, error.strerror, str(output)) from error
        raise
    finally:
        with contextlib.suppress(OSError):  # a folder gone read-only: the write's own error is the one to report
            temporary.unlink(missing_ok=True)


def write_text_whole(output: Union[str, Path], text: str) -> Path:
    """`text` (UTF-8) to `output`, whole or not at all."""
    with written_whole(output) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(output)


def spreadsheet_text(cell: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula: a string starting with ``= + - @``, a tab or a carriage
    return gets a leading ``'`` (OWASP's advice on CSV injection); a plain number (``-0.25``, ``1e-07``) stays as
    it is, and so does anything that is not a string.

    Class names and input file names come from whoever made the data: ``+cmd|' /C calc'!A0`` must not run.
    """
    if isinstance(cell, str) and cell[:1] in _FORMULA_SET and not _PLAIN_NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def spreadsheet_row(row: Sequence[Any]) -> Sequence[Any]:
    """`row` with each cell as :func:`spreadsheet_text` makes it; a row of strings none of which starts a formula
    (a classification's row, most of the time) is found so by one regular-expression scan and returned as it is."""
    try:
        joined = _CELL_SEPARATOR.join(row)
    except TypeError:  # a cell that is not a string
        return [spreadsheet_text(cell) for cell in row]
    if _A_CELL_STARTS_FORMULA.search(joined) is None:
        return row
    return [spreadsheet_text(cell) for cell in row]
