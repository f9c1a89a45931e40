"""``vtools compare REPORT REPORT [...]``: class reports side by side, with each class's change.

Its options, and what ``--help`` says of it: vtools/cli/compare_flags.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vtools.errors import UsageError
from vtools.evaluation.report_compare import (
    class_rows,
    load_reports,
    movers,
    overall_rows,
    report_inputs,
    report_kind,
)
from vtools.options.declare import ParsedOptions
from vtools.outputs import Output, check_outputs
from vtools.results import format_table, write_rows


def run(args: ParsedOptions) -> int:
    if len(args.reports) < 2:
        raise UsageError("give two or more reports to compare (the first is the reference)")
    if args.output:
        check_outputs(report_inputs(args.reports), [Output("--output", Path(args.output))])
    reports = load_reports(args.reports)
    short = [replace(report, label=chr(ord("A") + i)) for i, report in enumerate(reports)]  # console columns
    for letter, report in zip(short, reports):
        print(f"{letter.label} = {report.folder}{' (the reference)' if letter is short[0] else ''}")
    print()
    print(format_table(overall_rows(short)))
    samples = [report.overall.get("samples") for report in reports]
    if len(set(samples)) > 1:
        print(f"note: the reports cover different numbers of images ({', '.join(map(str, samples))})")
    rows = class_rows(short)
    print()
    print(format_table(rows))
    score = report_kind(reports).ranked_by
    for report in short[1:]:
        better, worse = movers(rows, report.label, args.top, score)
        print(
            f"\n{report.label} against A, by {score}: improved {', '.join(better) or 'none'}; "
            f"worsened {', '.join(worse) or 'none'}"
        )
    rows = class_rows(reports)  # the file's columns name the reports in full
    if args.output:
        print(f"per-class comparison written to {write_rows(args.output, rows, args.format)}")
    return 0
