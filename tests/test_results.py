"""vtools/results.py: the console table says what the results file holds (whole-script checks of the files:
tests/scripts/test_validate.py and test_inference.py, read with pandas)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vtools.errors import UsageError
from vtools.results import format_table, read_number_table

pytestmark = pytest.mark.cpu_only(reason="formats numbers on the host")


def test_a_score_never_reads_as_a_count() -> None:
    """85.0 % top-1 prints 85.00 (an integer look would read as 85 images); counts stay integers, small and
    undefined values keep their own form, and None is the csv's empty cell."""
    row = {"top1": 85.0, "top5": 99.0, "loss": 0.5141, "img_per_sec": 1101.26, "delta": -6.67, "zero": 0.0}
    row |= {"tiny": 0.0001234, "undefined": float("nan"), "samples": 300, "missing": None}
    header, values = format_table([row]).splitlines()
    assert header.split() == list(row)
    assert values.split() == ["85.00", "99.00", "0.5141", "1101.26", "-6.67", "0.00", "0.0001234", "nan", "300", "-"]


def test_scores_side_by_side_share_their_precision() -> None:
    """validate.py printed top1 85.00 beside top5 99.3333, and a column 84.3333 above 86.00: two decimals
    for every score, a column where a value below 1 needs it (a loss) four throughout."""
    _, one = format_table([{"top1": 85.0, "top5": 99.3333, "loss": 0.5023, "img_per_sec": 1995.906}]).splitlines()
    assert one.split() == ["85.00", "99.33", "0.5023", "1995.91"]
    _, *column = format_table([{"top1": 84.3333, "loss": 1.5}, {"top1": 86.0, "loss": 0.5}]).splitlines()
    assert [line.split() for line in column] == [["84.33", "1.5000"], ["86.00", "0.5000"]]


def test_a_hand_edited_summary_row_is_named_by_file_and_line(tmp_path: Path) -> None:
    """summary.csv's cells are numbers or empty (an epoch not validated); a row typed by hand stops the
    reader at once, naming the file and the line an editor shows, before a resume trains or a plot draws."""
    summary = tmp_path / "summary.csv"
    header = "epoch,train_loss,eval_loss,lr\n"
    summary.write_text(header + "0,1.5,,0.01\n1,1.2,1.1,0.005\n")
    assert [row["eval_loss"] for row in read_number_table(summary, "epoch")] == ["", "1.1"]
    for rows, error in (
        ("0,1.5,,0.01\n0,abc,def,\n", "line 3: train_loss is 'abc', not a number"),
        ("x,1.5,,0.01\n", "line 2: epoch is 'x', not a whole number"),
        (",1.5,,0.01\n", "line 2: epoch is empty, not a whole number"),
        ("0,1.5,,0.01,7\n", "line 2 has more cells than the header names"),
    ):
        summary.write_text(header + rows)
        with pytest.raises(UsageError, match=re.escape(f"{summary} {error}")):
            read_number_table(summary, "epoch")
    summary.write_text("step,loss\n0,1\n")
    with pytest.raises(UsageError, match="has no epoch column"):
        read_number_table(summary, "epoch")
