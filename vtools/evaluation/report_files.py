"""A class report as files in one folder: csv tables that pandas reads, each written atomically.

    overall.csv          one row: samples, top1/top5, macro and weighted precision/recall/F1, ECE
    per_class.csv        one row per class (support, correct, predicted, top1, top5, precision, recall, f1)
    confusion.csv        the square matrix, labels down, predictions across (read with index_col=0);
                         beyond 1000 classes confusion_cells.csv instead: its non-zero cells, one per row
    confused_pairs.csv   the most frequent (label, wrong prediction) pairs
    calibration.csv      the reliability diagram's bins
    misclassified.csv    the mistakes, most confident first

overall.csv is written last: a folder that has it holds a whole report.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vtools.atomic import atomic_write_text
from vtools.errors import UsageError
from vtools.evaluation.class_report import DENSE_CONFUSION_MAX, ClassReport, Confusion
from vtools.results import format_rows

OVERALL = "overall.csv"
PER_CLASS = "per_class.csv"
CONFUSION = "confusion.csv"
CONFUSION_CELLS = "confusion_cells.csv"
PAIRS = "confused_pairs.csv"
CALIBRATION = "calibration.csv"
MISTAKES = "misclassified.csv"
CONFUSION_CORNER = "true\\predicted"
MISTAKE_COLUMNS = ("sample", "index", "label", "predicted", "confidence", "label_probability", "label_rank")
PAIR_COLUMNS = ("true", "predicted", "count", "share_of_true", "true_index", "predicted_index")


def report_file_names(num_classes: int) -> list[str]:
    """The files ``write_report`` writes for a model with ``num_classes`` outputs, in writing order."""
    confusion = CONFUSION if num_classes <= DENSE_CONFUSION_MAX else CONFUSION_CELLS
    return [PER_CLASS, confusion, PAIRS, CALIBRATION, MISTAKES, OVERALL]


def write_report(
    folder: str | os.PathLike, report: ClassReport, before_write: Callable[[Path], None] | None = None
) -> list[Path]:
    """Write ``report``'s tables into ``folder``; ``before_write(path)`` is told of each file first (a
    run records what it creates)."""
    folder = Path(folder)
    contents = {
        PER_CLASS: format_rows(report.per_class, "csv"),
        CONFUSION: _square_csv(report),
        CONFUSION_CELLS: _cells_csv(report),
        PAIRS: _csv_or_header(report.pairs, PAIR_COLUMNS),
        CALIBRATION: format_rows(report.calibration, "csv"),
        MISTAKES: _csv_or_header(report.mistakes, MISTAKE_COLUMNS),
        OVERALL: format_rows([report.overall], "csv"),
    }
    written = []
    for name in report_file_names(len(report.classes)):
        path = folder / name
        if before_write is not None:
            before_write(path)
        written.append(atomic_write_text(path, contents[name]))
    return written


def _csv_or_header(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """A table with its header even when it has no rows (a model that made no mistake)."""
    return format_rows(rows, "csv") if rows else ",".join(columns) + "\n"


def _square_csv(report: ClassReport) -> str:
    if len(report.classes) > DENSE_CONFUSION_MAX:
        return ""
    matrix = report.confusion.dense()
    lines = [_csv_line([CONFUSION_CORNER, *report.classes])]
    lines += [_csv_line([name, *row.tolist()]) for name, row in zip(report.classes, matrix)]
    return "".join(lines)


def _cells_csv(report: ClassReport) -> str:
    true, predicted = np.divmod(report.confusion.cells, report.confusion.num_classes)
    rows = [
        {"true": report.classes[t], "predicted": report.classes[p], "count": int(c)}
        for t, p, c in zip(true, predicted, report.confusion.counts)
    ]
    return _csv_or_header(rows, ("true", "predicted", "count"))


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def read_table(path: Path, columns: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """A report's CSV table; a file that is not one (not UTF-8 text, not CSV, without ``columns``) is a
    one-line UsageError naming it, not a traceback."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            header = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"{path}: not a CSV table of a class report ({type(err).__name__}: {err})") from None
    missing = [name for name in columns if name not in header]
    if missing:
        raise UsageError(f"{path}: not a CSV table of a class report (no column {', '.join(missing)})")
    return rows


def report_folder(path: str | os.PathLike) -> Path:
    """The report folder that ``path`` names: the folder itself, or a train.py run's ``eval/``."""
    path = Path(path)
    for candidate in (path, path / "eval"):
        if (candidate / OVERALL).is_file():
            return candidate
    if path.is_file() and path.name == OVERALL:
        return path.parent
    raise UsageError(
        f"{path}: no class report here (a folder written by validate.py --report, or a train.py run folder "
        "with eval/overall.csv)"
    )


def read_confusion(folder: Path) -> tuple[list[str], Confusion]:
    """The class names (per_class.csv's order) and the confusion matrix of a report folder, from
    ``confusion.csv`` or ``confusion_cells.csv``."""
    classes = [row["class"] for row in read_table(folder / PER_CLASS)]
    n = len(classes)
    square = folder / CONFUSION
    if square.is_file():
        with square.open(newline="", encoding="utf-8") as handle:
            matrix = np.array([[int(v) for v in row[1:]] for row in list(csv.reader(handle))[1:]], dtype=np.int64)
        cells = np.flatnonzero(matrix)
        return classes, Confusion(n, cells, matrix.reshape(-1)[cells])
    position = {name: index for index, name in enumerate(classes)}
    rows = read_table(folder / CONFUSION_CELLS)
    flat = np.array([position[r["true"]] * n + position[r["predicted"]] for r in rows], dtype=np.int64)
    order = np.argsort(flat)
    return classes, Confusion(n, flat[order], np.array([int(r["count"]) for r in rows], dtype=np.int64)[order])
