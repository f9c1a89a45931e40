"""Scores of a multi-label classifier: each image has zero or more of K classes, each output a sigmoid.

Top-1 and the confusion matrix mean nothing when an image may carry several labels, so a multi-label run is
scored class by class on host arrays ``scores`` (N x K probabilities) and ``targets`` (N x K, 0/1), with
scikit-learn's definitions computed in numpy (scikit-learn is a test-only dependency; the tests compare
every figure with it):

- average precision (AP) per class is ``average_precision_score``: sum over thresholds of
  (R_n - R_{n-1}) P_n, where every distinct score is one threshold (tied samples enter together);
  mAP micro is the AP of the flattened arrays (``average='micro'``), negatives of every class included.
- A class with no positive has no meaningful AP (recall is 0/0 at every threshold); it scores 0, as
  scikit-learn's does (1.9: with a warning), and mAP macro averages over all K classes as
  ``average='macro'`` does, so the figures equal what users compute with scikit-learn. A class absent from
  the validation set thus lowers mAP macro; the class report's support column (0) shows which.
- precision, recall and F1 at ``threshold`` call a class predicted when its score is at least the
  threshold (a logit of exactly 0, probability 0.5, counts as predicted, as for the best-F1 thresholds
  below); they are ``precision_recall_fscore_support(..., zero_division=0)`` on those predictions, whose
  macro average is over all K columns (a class with neither labels nor predictions counts as 0) and whose
  micro average pools the counts.
- the best-F1 threshold of a class is the distinct score value t maximising F1 of ``score >= t`` (the
  highest such t on a tie); a class with no positive has F1 0 at every threshold, so NaN.

Everything is one sort per column (and one of the flattened array, for mAP micro) and cumulative sums:
O(N K log(N K)), no Python loop over samples; N=50,000 x K=80 takes about 1 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_THRESHOLD = 0.5


def multi_hot(label_lists: Sequence[Sequence[int]], num_classes: int, dtype: Any = np.uint8) -> np.ndarray:
    """N x ``num_classes`` 0/1 array from each sample's list of class indices (repeats count once)."""
    lengths = np.fromiter((len(labels) for labels in label_lists), dtype=np.int64, count=len(label_lists))
    columns = np.fromiter((c for labels in label_lists for c in labels), dtype=np.int64, count=int(lengths.sum()))
    if columns.size and (columns.min() < 0 or columns.max() >= num_classes):
        bad = columns[(columns < 0) | (columns >= num_classes)][0]
        raise ValueError(f"class index {bad} is not in 0..{num_classes - 1}")
    out = np.zeros((len(label_lists), num_classes), dtype=dtype)
    out[np.repeat(np.arange(len(label_lists)), lengths), columns] = 1
    return out


@dataclass(frozen=True, eq=False)
class MultiLabelReport:
    """Per-class arrays (length K, fractions, read-only) and their averages; see the module docstring."""

    class_names: tuple[str, ...]
    threshold: float
    samples: int
    support: np.ndarray  # positives per class
    predicted: np.ndarray  # samples with score >= threshold, per class
    ap: np.ndarray  # 0 where a class has no positive, as scikit-learn
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    best_threshold: np.ndarray  # NaN where a class has no positive
    best_f1: np.ndarray
    map_macro: float  # over all classes, as scikit-learn's average='macro'
    map_micro: float
    precision_macro: float
    recall_macro: float
    f1_macro: float
    precision_micro: float
    recall_micro: float
    f1_micro: float

    def rows(self) -> list[dict[str, Any]]:
        """One row per class for a csv class report: scores in percent as the single-label report has
        them, thresholds as probabilities, None where undefined (an empty csv cell)."""
        return [
            {
                "class": name,
                "index": index,
                "support": int(self.support[index]),
                "predicted": int(self.predicted[index]),
                "ap": _percent(self.ap[index]),
                "precision": _percent(self.precision[index]),
                "recall": _percent(self.recall[index]),
                "f1": _percent(self.f1[index]),
                "best_threshold": _rounded(self.best_threshold[index], 6),
                "best_f1": _percent(self.best_f1[index]),
            }
            for index, name in enumerate(self.class_names)
        ]

    def overall(self) -> dict[str, Any]:
        """The one-row summary, in percent, keyed like the single-label report's averages."""
        return {
            "samples": self.samples,
            "classes": len(self.class_names),
            "classes_with_positives": int((self.support > 0).sum()),
            "threshold": self.threshold,
            "map_macro": _percent(self.map_macro),
            "map_micro": _percent(self.map_micro),
            "macro_precision": _percent(self.precision_macro),
            "macro_recall": _percent(self.recall_macro),
            "macro_f1_score": _percent(self.f1_macro),
            "micro_precision": _percent(self.precision_micro),
            "micro_recall": _percent(self.recall_micro),
            "micro_f1_score": _percent(self.f1_micro),
        }


def multilabel_report(
    scores: np.ndarray,
    targets: np.ndarray,
    threshold: float = DEFAULT_THRESHOLD,
    class_names: Sequence[str] | None = None,
) -> MultiLabelReport:
    """Every multi-label figure of ``scores`` (N x K probabilities) against ``targets`` (N x K, 0/1)."""
    scores, targets = _checked(scores, targets)
    samples, num_classes = scores.shape
    names = tuple(str(i) for i in range(num_classes)) if class_names is None else tuple(class_names)
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for {num_classes} classes")

    ranked = _RankedColumns(scores, targets)
    support = ranked.positives
    ap = ranked.average_precision()
    best_threshold, best_f1 = ranked.best_f1()
    micro = _RankedColumns(scores.reshape(-1, 1), targets.reshape(-1, 1))

    predicted_positive = scores >= threshold
    hits = np.count_nonzero(predicted_positive & (targets > 0), axis=0).astype(np.float64)
    predicted = np.count_nonzero(predicted_positive, axis=0)
    precision, recall, f1 = _ratio(hits, predicted), _ratio(hits, support), _ratio(2 * hits, predicted + support)
    total_hits, total_predicted, total_support = hits.sum(), predicted.sum(), support.sum()

    arrays = dict(
        support=support.astype(np.int64),
        predicted=predicted.astype(np.int64),
        ap=ap,
        precision=precision,
        recall=recall,
        f1=f1,
        best_threshold=best_threshold,
        best_f1=best_f1,
    )
    for array in arrays.values():
        array.flags.writeable = False
    return MultiLabelReport(
        class_names=names,
        threshold=float(threshold),
        samples=samples,
        **arrays,
        map_macro=float(ap.mean()),
        map_micro=float(micro.average_precision()[0]),
        precision_macro=float(precision.mean()),
        recall_macro=float(recall.mean()),
        f1_macro=float(f1.mean()),
        precision_micro=float(_ratio(total_hits, total_predicted)),
        recall_micro=float(_ratio(total_hits, total_support)),
        f1_micro=float(_ratio(2 * total_hits, total_predicted + total_support)),
    )


class _RankedColumns:
    """Each column sorted by decreasing score, with the cumulative counts at the end of each run of ties:
    a threshold t = that score predicts exactly the samples up to and including the run's last one. Held
    transposed (one row per column, contiguous), which sorts and gathers several times faster."""

    def __init__(self, scores: np.ndarray, targets: np.ndarray) -> None:
        scores, targets = np.ascontiguousarray(scores.T), np.ascontiguousarray(targets.T)
        order = np.argsort(scores, axis=1)[:, ::-1]  # order within a run of ties does not matter
        self.scores = np.take_along_axis(scores, order, axis=1)
        self.labels = np.take_along_axis(targets, order, axis=1)
        samples = self.scores.shape[1]
        # a position ends its run of ties when the next score differs (or it is the last)
        self.run_end = np.ones_like(self.scores, dtype=bool)
        self.run_end[:, :-1] = self.scores[:, :-1] != self.scores[:, 1:]
        self.true_positives = np.cumsum(self.labels, axis=1)
        self.predicted = np.arange(1, samples + 1, dtype=np.float64)  # samples at or above each position
        self.positives = self.true_positives[:, -1]

    def average_precision(self) -> np.ndarray:
        """AP per column: each positive adds 1/P times the precision at the end of its run of ties (the
        threshold where it is first predicted); 0 for a column without positives, as scikit-learn."""
        samples = self.scores.shape[1]
        index = np.where(self.run_end, np.arange(samples), samples)
        end_of_run = np.minimum.accumulate(index[:, ::-1], axis=1)[:, ::-1]  # the next run end at or after
        precision_at_end = np.take_along_axis(self.true_positives, end_of_run, axis=1) / (end_of_run + 1)
        summed = (self.labels * precision_at_end).sum(axis=1)
        return _ratio(summed, self.positives)

    def best_f1(self) -> tuple[np.ndarray, np.ndarray]:
        """Per column, the distinct score t maximising F1 of ``score >= t`` (highest t on a tie) and that F1;
        NaN and 0 for a column without positives, where no threshold scores above 0."""
        f1 = 2 * self.true_positives / (self.predicted + self.positives[:, None])
        f1 = np.where(self.run_end, f1, -1.0)  # only whole runs of ties are thresholds
        best = f1.argmax(axis=1)
        columns = np.arange(f1.shape[0])
        has_positive = self.positives > 0
        threshold = np.where(has_positive, self.scores[columns, best], np.nan)
        return threshold, np.where(has_positive, f1[columns, best], 0.0)


def _checked(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores, targets = np.asarray(scores, dtype=np.float64), np.asarray(targets)
    if scores.ndim != 2 or scores.shape != targets.shape or scores.size == 0:
        raise ValueError(f"scores {scores.shape} and targets {targets.shape} must be the same N x K, N, K > 0")
    if not np.isfinite(scores).all():
        raise ValueError("scores hold NaN or infinity")
    if not np.isin(targets, (0, 1)).all():
        raise ValueError("targets must be 0/1 multi-hot (see multi_hot)")
    return scores, targets.astype(np.float64)


def _ratio(numerator: Any, denominator: Any, undefined: float = 0.0) -> np.ndarray:
    """numerator / denominator, ``undefined`` where the denominator is 0 (scikit-learn's zero_division=0)."""
    numerator, denominator = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    out = np.full(np.broadcast(numerator, denominator).shape, undefined)
    return np.divide(numerator, denominator, out=out, where=denominator > 0)


def _percent(value: float) -> float | None:
    return round(100 * float(value), 4) if np.isfinite(value) else None


def _rounded(value: float, digits: int) -> float | None:
    return round(float(value), digits) if np.isfinite(value) else None
