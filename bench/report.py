"""The table: printed, and written as JSON and Markdown."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, List

from bench.common import Row


def _value(row: Row) -> str:
    return "-" if row.value is None else f"{row.value:.3f} {row.unit}"


def _setup(row: Row) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.setup.items())


def text_table(rows: List[Row]) -> str:
    lines = []
    for row in rows:
        lines.append(f"{row.row:>2} {row.name:<72} {_value(row):>13}  bar {row.bar:<9} {row.status():<8} "
                     f"spread {row.spread or '-'}")
        if row.details:
            lines.append(f"   {row.details}")
        lines.append(f"   [{_setup(row)}]")
    return "\n".join(lines)


def markdown(rows: List[Row], environment: Dict[str, object], seconds: float) -> str:
    env = ", ".join(f"{k} {v}" for k, v in environment.items())
    lines = [
        "# trainkit benchmarks",
        "",
        f"Machine: {env}. Whole run: {seconds / 60:.1f} min.",
        "",
        "| row | benchmark | value | bar | status | spread | details | setup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row.row, row.name, _value(row), row.bar, row.status(), row.spread, row.details, _setup(row)]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write(rows: List[Row], environment: Dict[str, object], seconds: float, folder: Path) -> List[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    as_json = folder / "bench.json"
    as_markdown = folder / "bench.md"
    as_json.write_text(json.dumps({"environment": environment, "seconds": seconds,
                                   "rows": [{**dataclasses.asdict(r), "status": r.status()} for r in rows]},
                                  indent=2) + "\n")
    as_markdown.write_text(markdown(rows, environment, seconds))
    return [as_json, as_markdown]
