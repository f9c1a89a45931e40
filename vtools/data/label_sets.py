"""Multi-label samples' labels, one compact table for every store.

An image of a multi-label set carries zero or more classes. Each store that reads such a set (a labels
file beside a folder, a table's sequence column, shards with list-valued labels) keeps its labels here:
two arrays in CSR form (each sample's start in one flat array of class indices), so a million samples
cost a few megabytes, forked loader workers share them, and a sample's multi-hot row is made only when it
is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LabelSets:
    """The classes of each sample: sample i holds ``indices[offsets[i]:offsets[i + 1]]``."""

    offsets: np.ndarray  # int64, one more than there are samples
    indices: np.ndarray  # int32 class indices
    num_classes: int

    @classmethod
    def of(cls, label_lists: Iterable[Sequence[int]], num_classes: int) -> LabelSets:
        """From each sample's class indices (repeats kept once, order irrelevant)."""
        rows = [sorted(set(int(c) for c in labels)) for labels in label_lists]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(row) for row in rows])
        flat = [c for row in rows for c in row]
        indices = np.asarray(flat, dtype=np.int32) if flat else np.zeros(0, np.int32)
        if len(indices) and (indices.min() < 0 or indices.max() >= num_classes):
            raise ValueError(f"class index {int(indices[(indices < 0) | (indices >= num_classes)][0])} out of range")
        return cls(offsets, indices, num_classes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def classes_of(self, index: int) -> np.ndarray:
        """Sample ``index``'s class indices."""
        return self.indices[self.offsets[index] : self.offsets[index + 1]]

    def multi_hot(self, index: int) -> np.ndarray:
        """Sample ``index``'s targets: 1.0 for each of its classes, 0.0 elsewhere (float32, as BCE takes)."""
        row = np.zeros(self.num_classes, dtype=np.float32)
        row[self.classes_of(index)] = 1.0
        return row

    def positives(self) -> np.ndarray:
        """Samples per class."""
        return np.bincount(self.indices, minlength=self.num_classes)[: self.num_classes]
