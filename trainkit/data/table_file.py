"""Reading a CSV or Parquet file into named columns of Python values, ``None`` where a value is missing.

CSV is read with Python's ``csv`` module (a header row, then one row per sample); an empty cell or one of
:data:`MISSING` is a missing value, and a column is numeric when every value present parses as a number.
Parquet is read with pyarrow (the ``table`` extra: ``pip install 'trainkit[table]'``); a null or a float NaN is
missing, and a column is numeric when its type is a number or a bool.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from trainkit.errors import DataError

SUFFIXES = (".csv", ".parquet")
MISSING = frozenset({"", "NA", "N/A", "NaN", "nan", "null", "NULL", "None"})


@dataclass
class Table:
    """A table read from `path`: its columns in file order, each a list of values (None: missing)."""

    path: Path
    columns: Dict[str, List[object]]
    numeric: Dict[str, bool]

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


def read_table(path: Path) -> Table:
    """The table in `path` (.csv or .parquet); DataError naming the file when it cannot be read."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"{path}: a table must be a .csv or .parquet file")
    if not path.is_file():
        raise DataError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    table = _read_parquet(path) if path.suffix.lower() == ".parquet" else _read_csv(path)
    if not table.columns:
        raise DataError(f"{path} has no columns: its first row must name them")
    if not table.rows:
        raise DataError(f"{path} has no rows below its header")
    return table


def _read_csv(path: Path) -> Table:
    try:
        with open(path, newline="", encoding="utf-8-sig") as stream:
            rows = list(csv.reader(stream))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path} cannot be read as CSV: {' '.join(str(error).split())}") from error
    rows = [row for row in rows if row]  # blank lines
    if not rows:
        raise DataError(f"{path} is empty: it needs a header row naming the columns")
    header = [name.strip() for name in rows[0]]
    _check_header(path, header)
    for number, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise DataError(f"{path}: row {number} (line {number + 2}) has {len(row)} values, but the header names "
                            f"{len(header)} columns")
    columns: Dict[str, List[object]] = {}
    numeric: Dict[str, bool] = {}
    for index, name in enumerate(header):
        raw = [row[index].strip() for row in rows[1:]]
        values: List[object] = [None if text in MISSING else text for text in raw]
        parsed = [_number(v) if v is not None else None for v in values]
        is_numeric = all(p is not None for p, v in zip(parsed, values) if v is not None)
        columns[name] = parsed if is_numeric else values
        numeric[name] = is_numeric
    return Table(path, columns, numeric)


def _number(text: object) -> Optional[float]:
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _read_parquet(path: Path) -> Table:
    try:
        import pyarrow.parquet as pq
        import pyarrow.types as pat
    except ImportError as error:
        reason = "is not installed" if isinstance(error, ModuleNotFoundError) or "None in sys.modules" in str(error) \
            else f"cannot be imported ({' '.join(str(error).split())})"
        raise DataError(f"{path}: reading Parquet needs pyarrow, which {reason}: pip install 'trainkit[table]' "
                        "(or pip install 'pyarrow<21')") from error
    try:
        arrow = pq.read_table(path)
    except Exception as error:  # noqa: BLE001 -- pyarrow raises several types for a damaged file
        raise DataError(f"{path} cannot be read as Parquet: {' '.join(str(error).split())}") from error
    _check_header(path, list(arrow.column_names))
    columns: Dict[str, List[object]] = {}
    numeric: Dict[str, bool] = {}
    for name in arrow.column_names:
        column_type = arrow.schema.field(name).type
        is_numeric = pat.is_integer(column_type) or pat.is_floating(column_type) or pat.is_boolean(column_type)
        values = arrow.column(name).to_pylist()
        if is_numeric:
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
