"""What a validation says class by class: the tables behind ``validate.py --report`` and a run's ``eval/``.

Everything here is computed on the host from :class:`Predictions` (one row
per sample, gathered once), so the same numbers come out of one process or
of every rank of a torchrun job. Scores are percentages, as timm reports
top-1; per-class precision/recall/F1 and their averages are scikit-learn's
definitions (``zero_division=0``), and the macro and weighted averages are
timm's ``--metrics-avg`` figures. A class's top-1 is its recall.

Calibration uses equal-width confidence bins, each holding the confidences in
``(low, high]`` (the first also 0), as scikit-learn's ``calibration_curve``
bins them; the expected calibration error is the sample-weighted mean gap
between a bin's accuracy and its mean confidence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vtools.evaluation.metrics import averaged_scores, per_class_scores
from vtools.evaluation.predictions import Predictions

REPORT_AVERAGES = ("macro", "weighted")
DEFAULT_BINS = 15
DENSE_CONFUSION_MAX = 1000  # classes up to which the confusion matrix is written as a square table
TOP_PAIRS = 50


@dataclass
class ClassReport:
    """The tables of one validation; ``overall`` is the one-row summary ``vtools compare`` lines up."""

    overall: dict[str, Any]
    per_class: list[dict[str, Any]]
    confusion: Confusion
    classes: list[str]
    pairs: list[dict[str, Any]]
    calibration: list[dict[str, Any]]
    mistakes: list[dict[str, Any]] = field(default_factory=list)


def build_report(
    predictions: Predictions,
    classes: Sequence[str],
    sample_name: Callable[[int], str] | None = None,
    bins: int = DEFAULT_BINS,
    worst: int = 0,
    about: dict[str, Any] | None = None,
) -> ClassReport:
    """The report of ``predictions`` over ``classes`` (the model's scored outputs, by index); ``worst``
    keeps only that many of the most confident mistakes (0: all); ``about`` leads the overall row."""
    n = len(classes)
    confusion = Confusion.of(predictions.target, predictions.predicted, n)
    hits, predicted, true = confusion.class_counts()
    calibration, ece = calibration_bins(predictions.confidence, predictions.correct, bins)
    overall = {**(about or {}), "samples": len(predictions)}
    overall["top1"] = _percent(predictions.correct.sum(), len(predictions))
    overall["top5"] = _percent((predictions.target_rank < min(5, n)).sum(), len(predictions))
    for average in REPORT_AVERAGES:
        precision, recall, f1 = averaged_scores(hits, predicted, true, average)
        overall.update(
            {
                f"{average}_precision": round(100 * precision, 4),
                f"{average}_recall": round(100 * recall, 4),
                f"{average}_f1_score": round(100 * f1, 4),
            }
        )
    overall["ece"] = round(100 * ece, 4)
    overall["mean_confidence"] = _percent(predictions.confidence.sum(), len(predictions))
    return ClassReport(
        overall=overall,
        per_class=per_class_rows(predictions, classes, confusion),
        confusion=confusion,
        classes=list(classes),
        pairs=confused_pairs(confusion, classes),
        calibration=calibration,
        mistakes=mistake_rows(predictions, classes, sample_name, worst),
    )


@dataclass(frozen=True)
class Confusion:
    """The confusion matrix as its non-zero cells (row = label, column = prediction): a 21 000-class
    matrix would not fit in memory as a square, its non-zero cells always do."""

    num_classes: int
    cells: np.ndarray  # flat index label * num_classes + prediction, ascending
    counts: np.ndarray

    @classmethod
    def of(cls, target: np.ndarray, predicted: np.ndarray, num_classes: int) -> Confusion:
        cells, counts = np.unique(target.astype(np.int64) * num_classes + predicted, return_counts=True)
        return cls(num_classes, cells, counts.astype(np.int64))

    def class_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per class: correct predictions, predictions, labels."""
        n = self.num_classes
        true, predicted = np.divmod(self.cells, n)
        hits = np.bincount(true[true == predicted], weights=self.counts[true == predicted], minlength=n)
        return (
            hits.astype(np.int64),
            np.bincount(predicted, weights=self.counts, minlength=n).astype(np.int64),
            np.bincount(true, weights=self.counts, minlength=n).astype(np.int64),
        )

    def dense(self, keep: Sequence[int] | None = None) -> np.ndarray:
        """The square matrix, or its rows and columns ``keep`` (in that order)."""
        n = self.num_classes
        keep = list(range(n)) if keep is None else list(keep)
        position = np.full(n, -1)
        position[keep] = np.arange(len(keep))
        true, predicted = np.divmod(self.cells, n)
        rows, columns = position[true], position[predicted]
        inside = (rows >= 0) & (columns >= 0)
        matrix = np.zeros((len(keep), len(keep)), dtype=np.int64)
        np.add.at(matrix, (rows[inside], columns[inside]), self.counts[inside])
        return matrix

    def errors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The off-diagonal cells: labels, predictions, counts."""
        true, predicted = np.divmod(self.cells, self.num_classes)
        wrong = true != predicted
        return true[wrong], predicted[wrong], self.counts[wrong]


def per_class_rows(predictions: Predictions, classes: Sequence[str], confusion: Confusion) -> list[dict[str, Any]]:
    """One row per class: its support, top-1 (= recall) and top-5 over its samples, precision, F1."""
    n = len(classes)
    hits, predicted, true = confusion.class_counts()
    precision, recall, f1 = per_class_scores(hits, predicted, true)
    top5_hits = np.bincount(predictions.target[predictions.target_rank < min(5, n)], minlength=n)
    rows = []
    for index, name in enumerate(classes):
        support = int(true[index])
        rows.append(
            {
                "class": name,
                "index": index,
                "support": support,
                "correct": int(hits[index]),
                "predicted": int(predicted[index]),
                "top1": _percent(hits[index], support),
                "top5": _percent(top5_hits[index], support),
                "precision": round(100 * float(precision[index]), 4),
                "recall": round(100 * float(recall[index]), 4),
                "f1": round(100 * float(f1[index]), 4),
            }
        )
    return rows


def confused_pairs(confusion: Confusion, classes: Sequence[str], top: int = TOP_PAIRS) -> list[dict[str, Any]]:
    """The ``top`` most frequent (label, wrong prediction) pairs, most frequent first (ties: by label,
    then prediction)."""
    true, predicted, counts = confusion.errors()
    order = np.lexsort((predicted, true, -counts))[:top]
    support = confusion.class_counts()[2]
    return [
        {
            "true": classes[true[i]],
            "predicted": classes[predicted[i]],
            "count": int(counts[i]),
            "share_of_true": _percent(counts[i], support[true[i]]),
            "true_index": int(true[i]),
            "predicted_index": int(predicted[i]),
        }
        for i in order
    ]


def calibration_bins(confidence: np.ndarray, correct: np.ndarray, bins: int) -> tuple[list[dict[str, Any]], float]:
    """Equal-width confidence bins (accuracy, mean confidence and count of each) and the expected
    calibration error (a fraction)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.searchsorted(edges[1:-1], confidence, side="left")
    counts = np.bincount(which, minlength=bins)
    hits = np.bincount(which, weights=correct.astype(np.float64), minlength=bins)
    confidence_sums = np.bincount(which, weights=confidence, minlength=bins)
    rows, gap_sum = [], 0.0
    for b in range(bins):
        count = int(counts[b])
        accuracy = hits[b] / count if count else float("nan")
        mean_confidence = confidence_sums[b] / count if count else float("nan")
        if count:
            gap_sum += count * abs(accuracy - mean_confidence)
        rows.append(
            {
                "low": round(float(edges[b]), 6),
                "high": round(float(edges[b + 1]), 6),
                "count": count,
                "accuracy": round(100 * accuracy, 4) if count else None,
                "confidence": round(100 * mean_confidence, 4) if count else None,
            }
        )
    total = int(counts.sum())
    return rows, (gap_sum / total if total else 0.0)


def mistake_rows(
    predictions: Predictions, classes: Sequence[str], sample_name: Callable[[int], str] | None, worst: int
) -> list[dict[str, Any]]:
    """The misclassified samples, most confident first (``worst`` > 0: only that many)."""
    wrong = np.flatnonzero(~predictions.correct)
    wrong = wrong[np.lexsort((predictions.index[wrong], -predictions.confidence[wrong]))]
    if worst > 0:
        wrong = wrong[:worst]
    rows = []
    for row in wrong:
        index, label, guess = (
            int(predictions.index[row]),
            int(predictions.target[row]),
            int(predictions.predicted[row]),
        )
        rows.append(
            {
                "sample": sample_name(index) if sample_name is not None else str(index),
                "index": index,
                "label": classes[label],
                "predicted": classes[guess],
                "confidence": round(100 * float(predictions.confidence[row]), 4),
                "label_probability": round(100 * float(predictions.target_prob[row]), 4),
                "label_rank": int(predictions.target_rank[row]) + 1,
            }
        )
    return rows


def _percent(part: float, whole: float) -> float:
    return round(100 * float(part) / float(whole), 4) if whole else 0.0
