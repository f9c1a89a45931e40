"""LabelSets: each sample's classes in two arrays, its multi-hot row made when read."""

from __future__ import annotations

import numpy as np
import pytest

from vtools.data.label_sets import LabelSets

pytestmark = pytest.mark.cpu_only(reason="host arrays; no tensor is made")


def test_rows_hold_each_samples_classes_once_sorted() -> None:
    sets = LabelSets.of([[2, 0, 2], [], [1]], num_classes=3)
    assert len(sets) == 3
    assert sets.classes_of(0).tolist() == [0, 2] and sets.classes_of(1).tolist() == []
    np.testing.assert_array_equal(sets.multi_hot(0), np.array([1, 0, 1], dtype=np.float32))
    assert sets.multi_hot(1).dtype == np.float32 and not sets.multi_hot(1).any()
    np.testing.assert_array_equal(sets.positives(), [1, 1, 1])
    assert sets.offsets.dtype == np.int64 and sets.indices.dtype == np.int32  # arrays, not lists


def test_an_index_beyond_the_classes_is_refused() -> None:
    with pytest.raises(ValueError, match="class index 3 out of range"):
        LabelSets.of([[0], [3]], num_classes=3)
    with pytest.raises(ValueError, match="class index -1 out of range"):
        LabelSets.of([[-1]], num_classes=3)


def test_no_sample_at_all() -> None:
    sets = LabelSets.of([], num_classes=2)
    assert len(sets) == 0 and sets.positives().tolist() == [0, 0]
