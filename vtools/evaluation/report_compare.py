"""Class reports side by side: what changed between two validations, class by class.

Before and after fine-tuning, an npu against a cpu on the same weights, two
checkpoints: classes are matched by name, every report is set against the
first, and a delta is that report's score minus the first's (in points).
Single-label reports are compared by top-1 and F1; multi-label ones (whose
overall.csv holds mAP) by mAP, AP and F1; the two kinds are not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtools.errors import UsageError
from vtools.evaluation.report_files import OVERALL, PER_CLASS, read_table, report_folder


@dataclass(frozen=True)
class ReportKind:
    """What a kind of class report is compared by: its headline figures, its per-class scores, and the score
    that ranks the classes that improved and worsened."""

    name: str
    overall_keys: tuple[str, ...]
    class_scores: tuple[str, ...]

    @property
    def ranked_by(self) -> str:
        return self.class_scores[0]


SINGLE_LABEL = ReportKind(
    "single-label", ("samples", "top1", "top5", "macro_f1_score", "weighted_f1_score", "ece"), ("top1", "f1")
)
MULTI_LABEL = ReportKind(
    "multi-label",
    ("samples", "map_macro", "map_micro", "macro_f1_score", "micro_f1_score", "macro_precision", "macro_recall"),
    ("ap", "f1"),
)


@dataclass(frozen=True)
class LoadedReport:
    label: str
    folder: Path
    overall: dict[str, str]
    classes: dict[str, dict[str, str]]  # class name -> its per_class.csv row


def load_reports(paths: Sequence[str]) -> list[LoadedReport]:
    """Each path's report, labelled by its folder name (the path itself where names repeat)."""
    folders = [report_folder(path) for path in paths]
    names = [_name(folder) for folder in folders]
    labels = [name if names.count(name) == 1 else str(path) for name, path in zip(names, paths)]
    reports = []
    for label, folder in zip(labels, folders):
        rows = read_table(folder / PER_CLASS, columns=("class",))
        overall = read_table(folder / OVERALL)
        if not overall:
            raise UsageError(f"{folder / OVERALL}: no row (a class report's overall.csv holds one)")
        reports.append(LoadedReport(label, folder, overall[0], {r["class"]: r for r in rows}))
    kinds = [_kind_of(report) for report in reports]
    other = next(((path, kind) for path, kind in zip(paths, kinds) if kind != kinds[0]), None)
    if other is not None:
        raise UsageError(
            f"{paths[0]} is a {kinds[0].name} report and {other[0]} a {other[1].name} one: their scores do not "
            "compare; compare reports of one kind"
        )
    shared = set(reports[0].classes).intersection(*(r.classes for r in reports[1:]))
    if not shared:
        raise UsageError(f"{paths[0]} and the other reports share no class name: nothing to compare")
    return reports


def report_kind(reports: Sequence[LoadedReport]) -> ReportKind:
    """The kind of the (loaded, so alike) reports."""
    return _kind_of(reports[0])


def _kind_of(report: LoadedReport) -> ReportKind:
    return MULTI_LABEL if "map_macro" in report.overall else SINGLE_LABEL


def report_inputs(paths: Sequence[str]) -> list[tuple[str, Path]]:
    """The files a comparison of ``paths`` reads, as (what, path): where its output must not go."""
    return [(f"REPORT {path}'s {name}", report_folder(path) / name) for path in paths for name in (OVERALL, PER_CLASS)]


def _name(folder: Path) -> str:
    """A run's report is named after its run folder, a validate.py report after its own."""
    return folder.parent.name if folder.name == "eval" else folder.name


def overall_rows(reports: Sequence[LoadedReport]) -> list[dict[str, Any]]:
    """One row per headline figure, one column per report, then each later report's delta to the first."""
    rows = []
    for key in report_kind(reports).overall_keys:
        values = [_number(report.overall.get(key)) for report in reports]
        row: dict[str, Any] = {"metric": key}
        row.update({report.label: value for report, value in zip(reports, values)})
        for report, value in zip(reports[1:], values[1:]):
            row[f"delta {report.label}"] = _delta(value, values[0])
        rows.append(row)
    return rows


def class_rows(reports: Sequence[LoadedReport]) -> list[dict[str, Any]]:
    """Per class (the first report's order, then classes only later ones have): support, and the kind's
    scores (top-1 and F1; AP and F1) in each report with their deltas to the first."""
    order = list(reports[0].classes)
    order += [name for report in reports[1:] for name in report.classes if name not in order]
    rows = []
    for name in order:
        row: dict[str, Any] = {"class": name, "support": _number(_field(reports[0], name, "support"))}
        for score in report_kind(reports).class_scores:
            values = [_number(_field(report, name, score)) for report in reports]
            row.update({f"{score} {report.label}": value for report, value in zip(reports, values)})
            for report, value in zip(reports[1:], values[1:]):
                row[f"delta {score} {report.label}"] = _delta(value, values[0])
        rows.append(row)
    return rows


def movers(rows: Sequence[dict[str, Any]], label: str, top: int, score: str) -> tuple[list[str], list[str]]:
    """The ``top`` classes whose ``score`` (the kind's ranking score) rose most and fell most in report
    ``label``, as 'name +x.xx'."""
    key = f"delta {score} {label}"
    changed = [(row[key], row["class"]) for row in rows if row.get(key) not in (None, 0.0)]
    better = sorted((c for c in changed if c[0] > 0), key=lambda c: (-c[0], c[1]))[:top]
    worse = sorted((c for c in changed if c[0] < 0), key=lambda c: (c[0], c[1]))[:top]
    return [f"{name} {delta:+.2f}" for delta, name in better], [f"{name} {delta:+.2f}" for delta, name in worse]


def _field(report: LoadedReport, name: str, key: str) -> str | None:
    row = report.classes.get(name)
    return row.get(key) if row is not None else None


def _number(text: str | None) -> float | None:
    if text in (None, ""):
        return None
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def _delta(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else round(value - base, 2)
