"""Result tables: csv, json or jsonl files that pandas reads, and the console table the scripts print."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vtools.atomic import atomic_write_text
from vtools.errors import UsageError

RESULT_FORMATS = ("csv", "json", "jsonl")


def format_rows(rows: Sequence[dict[str, Any]], fmt: str) -> str:
    """Rows as csv (header from the union of keys, in first-seen order), json or jsonl. A number that is
    not finite (nan, inf) is written as null in json and jsonl and as an empty cell in csv, which pandas
    reads as NaN: never as a bare NaN, which is not JSON."""
    rows = [finite_or_none(row) for row in rows]
    if fmt == "json":
        return json.dumps(rows, indent=2, allow_nan=False) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
    if fmt == "csv":
        flat = [_flatten(row) for row in rows]
        columns: list[str] = []
        for row in flat:
            columns.extend(key for key in row if key not in columns)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        return buffer.getvalue()
    raise UsageError(f"unknown results format {fmt!r} (choose from {', '.join(RESULT_FORMATS)})")


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (nan, inf) replaced by None, in nested rows too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def _flatten(row: dict[str, Any]) -> dict[str, Any]:
    """Spread list values over numbered columns (label_1, label_2, ...) so every csv cell is a scalar."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, (list, tuple)):
            flat.update({f"{key}_{rank}": item for rank, item in enumerate(value, 1)})
        else:
            flat[key] = json.dumps(value) if isinstance(value, dict) else value
    return flat


def write_rows(path: str | os.PathLike, rows: Sequence[dict[str, Any]], fmt: str) -> Path:
    return atomic_write_text(path, format_rows(rows, fmt))


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A plain aligned text table for the console."""
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    decimals = {column: _decimals([row.get(column) for row in rows]) for column in columns}
    cells = [[_short(row.get(c, ""), decimals[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _decimals(values: Sequence[Any]) -> int:
    """One precision per column, so 84.33 never stands beside 86.00 as 84.3333: two decimals, four where a
    value below 1 needs them (a loss)."""
    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != 0]
    return 4 if any(v < 1 for v in floats) else 2


def _short(value: Any, decimals: int = 2) -> str:
    if value is None:  # a value that is not there: the csv's empty cell, NaN to pandas
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value) or 0 < abs(value) < 1e-3:
            return f"{value:.4g}"
        return f"{value:.{decimals}f}"  # 85.00, not 85: a score never reads as a count
    text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_number_table(path: Path, first: str) -> list[dict[str, str]]:
    """The rows of a csv file of numbers that vtools wrote (summary.csv), each cell a number or empty, and
    the ``first`` column a whole number. A hand-edited cell would otherwise fail far from here, after a
    resumed run trained or half way through a picture: it stops at once, naming the file, line and column.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is not None and first not in reader.fieldnames:
                raise UsageError(f"{path} has no {first} column: not a table vtools wrote")
            rows = []
            for row in reader:
                _check_number_row(path, reader.line_num, row, first)
                rows.append(row)
    except (csv.Error, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not a readable csv table ({type(err).__name__}: {err})") from err
    return rows


def _check_number_row(path: Path, line: int, row: dict[str, Any], first: str) -> None:
    """Refuse a row with a cell that is not a number, or cells beyond the header's columns."""
    where = f"{path} line {line}"
    if None in row:  # csv puts the cells beyond the header's columns under the key None
        raise UsageError(f"{where} has more cells than the header names: repair or delete that line")
    for column, cell in row.items():
        if cell in ("", None) and column != first:
            continue
        try:
            int(cell) if column == first else float(cell)
        except (TypeError, ValueError):
            kind, shown = ("a whole number" if column == first else "a number"), repr(cell) if cell else "empty"
            raise UsageError(f"{where}: {column} is {shown}, not {kind}: repair or delete that line") from None
