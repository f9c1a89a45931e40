"""vtools/evaluation/metrics.py's own arithmetic; the scores themselves are compared with scikit-learn in
tests/evaluation/test_class_report.py."""

from __future__ import annotations

import numpy as np
import pytest

from vtools.evaluation.metrics import _ratio

pytestmark = pytest.mark.cpu_only(reason="numpy arithmetic on the host")


def test_a_ratio_over_nothing_is_zero_whatever_memory_it_gets() -> None:
    """A class with no prediction (or no sample) scores 0, not whatever the output's memory held: numpy hands
    a freed buffer of the same size to the next array, so each round leaves a non-zero one behind first."""
    numerator = np.arange(10, dtype=np.float64)
    denominator = np.array([0, 1, 2, 0, 3, 0, 1, 1, 0, 2], dtype=np.float64)
    for garbage in range(1, 21):
        left_behind = np.full(10, float(garbage))
        del left_behind
        ratio = _ratio(numerator, denominator)
        assert ratio[denominator == 0].tolist() == [0.0] * 4
        assert ratio[denominator > 0].tolist() == (numerator[denominator > 0] / denominator[denominator > 0]).tolist()
