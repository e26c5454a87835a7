"""Reading a CSV or Parquet file into named columns of Python values, ``None`` where a value is missing.

CSV is read with Python's ``csv`` module (a header row, then one row per sample); an empty cell or one of
:data:`MISSING` is a missing value, and a column is numeric when every value present parses as a number.
Parquet is read with pyarrow (the ``table`` extra: ``pip install 'trainkit[table]'``); a null or a float NaN is
missing, and a column is numeric when its type is a number or a bool.

The file is opened by :mod:`trainkit.data.input_file` (a regular file only). A table has at most
:data:`MAX_COLUMNS` columns, and a line of a CSV file at most :data:`MAX_LINE_CHARACTERS` characters: the header
line is read alone, bounded, and its columns counted before any row is parsed (a Parquet file's from its footer),
so a header of a million columns is refused in a fraction of a second instead of being parsed for minutes.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, TextIO

from trainkit.data.input_file import open_input
from trainkit.errors import DataError

SUFFIXES = (".csv", ".parquet")
MISSING = frozenset({"", "NA", "N/A", "NaN", "nan", "null", "NULL", "None"})
MAX_COLUMNS = 10_000
# The longest line of a CSV file read: room for MAX_COLUMNS columns of about 100 characters.
MAX_LINE_CHARACTERS = 1 << 20


@dataclass
class Table:
    """A table read from `path`: its columns in file order, each a list of values (None: missing)."""

    path: Path
    columns: Dict[str, List[object]]
    numeric: Dict[str, bool]

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


def read_table(path: Path, raw: bool = False) -> Table:
    """The table in `path` (.csv or .parquet); DataError naming the file when it cannot be read.

    Args:
        raw: every value as the file writes it, a string (a CSV cell stripped; a Parquet value as ``str``), None
            only for an empty CSV cell or a Parquet null: text read as text (``data=text``), not ``"NA"`` taken
            for a missing value nor ``"007"`` for the number 7. ``numeric`` still says which columns hold numbers.
    """
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"{path}: a table must be a .csv or .parquet file")
    with open_input(path) as stream:
        table = _read_parquet(path, stream, raw) if path.suffix.lower() == ".parquet" else _read_csv(path, stream, raw)
    if not table.columns:
        raise DataError(f"{path} has no columns: its first row must name them")
    if not table.rows:
        raise DataError(f"{path} has no rows below its header")
    return table


def _read_csv(path: Path, stream, raw: bool = False) -> Table:
    try:
        with io.TextIOWrapper(stream, encoding="utf-8-sig", newline="") as text:
            header, rows = _csv_rows(path, text)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path} cannot be read as CSV: {' '.join(str(error).split())}") from error
    columns: Dict[str, List[object]] = {}
    numeric: Dict[str, bool] = {}
    for index, name in enumerate(header):
        cells = [row[index].strip() for row in rows]
        values: List[object] = [None if text in MISSING else text for text in cells]
        parsed = [_number(v) if v is not None else None for v in values]
        is_numeric = all(p is not None for p, v in zip(parsed, values) if v is not None)
        columns[name] = [text or None for text in cells] if raw else parsed if is_numeric else values
        numeric[name] = is_numeric
    return Table(path, columns, numeric)


def _csv_rows(path: Path, text: TextIO):
    """The header (names stripped) and the rows below it; blank lines left out. The header's columns are counted
    (against MAX_COLUMNS) before a row is read, and each row's against the header's as it is read."""
    reader = csv.reader(_lines(path, text))
    first = next((row for row in reader if row), None)
    if first is None:
        raise DataError(f"{path} is empty: it needs a header row naming the columns")
    _check_column_count(path, len(first))
    header = [name.strip() for name in first]
    _check_header(path, header)
    rows = []
    for number, row in enumerate(row for row in reader if row):
        if len(row) != len(header):
            raise DataError(f"{path}: row {number} (line {reader.line_num}) has {len(row)} values, but the header "
                            f"names {len(header)} columns")
        rows.append(row)
    return header, rows


def _lines(path: Path, text: TextIO) -> Iterator[str]:
    """The lines of `text`, each read with a bound of MAX_LINE_CHARACTERS: one line naming the file past it (for
    the header, with the columns counted in what was read)."""
    number, header_seen = 0, False
    while True:
        line = text.readline(MAX_LINE_CHARACTERS + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_CHARACTERS:
            if not header_seen:
                _check_column_count(path, _columns_in(line), partial=True)
            raise DataError(f"{path}: line {number} is longer than {MAX_LINE_CHARACTERS:,} characters, the most "
                            "trainkit reads in one line of a table")
        header_seen = header_seen or bool(line.strip())
        yield line


def _columns_in(text: str) -> int:
    try:
        return len(next(csv.reader([text]), []))
    except csv.Error:  # an open quote cut by the bound
        return text.count(",") + 1


def _check_column_count(path: Path, count: int, partial: bool = False) -> None:
    if count > MAX_COLUMNS:
        found = (f"at least {count:,} columns (in the first {MAX_LINE_CHARACTERS:,} characters of its header)"
                 if partial else f"{count:,} columns")
        raise DataError(f"{path} has {found}; a table may have at most {MAX_COLUMNS:,}: keep the columns you need "
                        "in a file of their own")


def _number(text: object) -> Optional[float]:
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _read_parquet(path: Path, stream, raw: bool = False) -> Table:
    try:
        import pyarrow.parquet as pq
        import pyarrow.types as pat
    except ImportError as error:
        reason = "is not installed" if isinstance(error, ModuleNotFoundError) or "None in sys.modules" in str(error) \
            else f"cannot be imported ({' '.join(str(error).split())})"
        raise DataError(f"{path}: reading Parquet needs pyarrow, which {reason}: pip install 'trainkit[table]' "
                        "(or pip install 'pyarrow<21')") from error
    try:
        parquet = pq.ParquetFile(stream)
        _check_column_count(path, parquet.metadata.num_columns)  # the footer's count: no column read yet
        arrow = parquet.read()
    except DataError:
        raise
    except Exception as error:  # noqa: BLE001 -- pyarrow raises several types for a damaged file
        raise DataError(f"{path} cannot be read as Parquet: {' '.join(str(error).split())}") from error
    _check_header(path, list(arrow.column_names))
    columns: Dict[str, List[object]] = {}
    numeric: Dict[str, bool] = {}
    for name in arrow.column_names:
        column_type = arrow.schema.field(name).type
        is_numeric = pat.is_integer(column_type) or pat.is_floating(column_type) or pat.is_boolean(column_type)
        values = arrow.column(name).to_pylist()
        if raw:
            values = [None if v is None else str(v) for v in values]
        elif is_numeric:
            values = [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]
        else:
            values = [None if v is None else str(v) for v in values]
        columns[name] = values
        numeric[name] = is_numeric
    return Table(path, columns, numeric)


def _check_header(path: Path, header: List[str]) -> None:
    seen = set()
    for index, name in enumerate(header):
        if not name:
            raise DataError(f"{path}: column {index} has no name in the header")
        if name in seen:
            raise DataError(f"{path}: two columns are named {name!r}")
        seen.add(name)
