"""vtools/results.py: the console table says what the results file holds (whole-script checks of the files:
tests/scripts/test_validate.py and test_inference.py, read with pandas)."""

from __future__ import annotations

import pytest

from vtools.results import format_table

pytestmark = pytest.mark.cpu_only(reason="formats numbers on the host")


def test_a_score_never_reads_as_a_count() -> None:
    """85.0 % top-1 prints 85.00 (an integer look would read as 85 images); counts stay integers, small and
    undefined values keep their own form, and None is the csv's empty cell."""
    row = {"top1": 85.0, "top5": 99.0, "loss": 0.5141, "img_per_sec": 1101.26, "delta": -6.67, "zero": 0.0}
    row |= {"tiny": 0.0001234, "undefined": float("nan"), "samples": 300, "missing": None}
    header, values = format_table([row]).splitlines()
    assert header.split() == list(row)
    assert values.split() == ["85.00", "99.00", "0.5141", "1101.26", "-6.67", "0.00", "0.0001234", "nan", "300", "-"]
