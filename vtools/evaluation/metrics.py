"""What validate.py reports beyond top-1/top-5: timm's --metrics-avg, --valid-labels and --real-labels.

- ``ClassCounts``: per-class true positives, predictions and targets, counted on the
  device; precision, recall and F1 from them are the numbers timm's validate.py gets
  from scikit-learn's ``precision_score``/``recall_score``/``f1_score`` (``average``
  micro, macro or weighted, ``zero_division=0``) on the argmax predictions, without
  keeping every prediction or needing scikit-learn.
- ``read_valid_labels``: the output indices a partial-label-space set is scored on.
- ``RealLabels``: timm's ``RealLabelsImagenet`` (ImageNet "ReaL" labels), fed batch by
  batch with the file names of the images each batch holds (so a skipped image
  does not shift the names of the next ones).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from vtools.errors import UsageError

METRICS_AVERAGES = ("micro", "macro", "weighted")


class ClassCounts:
    """Per-class counts of argmax predictions against targets, kept on the device."""

    def __init__(self, num_classes: int, device: torch.device) -> None:
        self.num_classes = num_classes
        self.counts = torch.zeros(3, num_classes, dtype=torch.int64, device=device)  # hits, predicted, true

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        predicted = logits.argmax(dim=1)
        n = self.num_classes
        self.counts[0] += torch.bincount(targets[predicted == targets], minlength=n)
        self.counts[1] += torch.bincount(predicted, minlength=n)
        self.counts[2] += torch.bincount(targets, minlength=n)

    def scores(self, average: str) -> tuple[float, float, float]:
        """Precision, recall and F1 (fractions) as scikit-learn averages them with ``zero_division=0``."""
        hits, predicted, true = self.counts.cpu().double().numpy()
        return averaged_scores(hits, predicted, true, average)

    def row(self, average: str) -> dict[str, float]:
        """timm's result keys and rounding: ``<average>_precision``, ``_recall``, ``_f1_score`` in percent."""
        precision, recall, f1 = self.scores(average)
        return {
            f"{average}_precision": round(100 * precision, 4),
            f"{average}_recall": round(100 * recall, 4),
            f"{average}_f1_score": round(100 * f1, 4),
        }


def per_class_scores(hits: np.ndarray, predicted: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-class precision, recall and F1 (fractions) from per-class counts of correct top-1 predictions,
    of predictions and of labels; 0 where a class has none (scikit-learn's ``zero_division=0``)."""
    return _ratio(hits, predicted), _ratio(hits, true), _ratio(2 * hits, predicted + true)


def averaged_scores(hits: np.ndarray, predicted: np.ndarray, true: np.ndarray, average: str) -> tuple[float, ...]:
    """Precision, recall and F1 averaged as scikit-learn's ``average=`` over the classes that occur among
    the labels or the predictions (micro: from the summed counts; macro: plain mean; weighted: by support)."""
    if average not in METRICS_AVERAGES:
        raise ValueError(f"unknown average {average!r}: use one of {', '.join(METRICS_AVERAGES)}")
    present = (predicted + true) > 0
    hits, predicted, true = (np.asarray(a, dtype=np.float64)[present] for a in (hits, predicted, true))
    if average == "micro":
        return tuple(
            float(v[0])
            for v in per_class_scores(hits.sum(keepdims=True), predicted.sum(keepdims=True), true.sum(keepdims=True))
        )
    weights = np.ones_like(true) if average == "macro" else true
    if weights.sum() == 0:
        return 0.0, 0.0, 0.0
    return tuple(float((values * weights).sum() / weights.sum()) for values in per_class_scores(hits, predicted, true))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0."""
    numerator, denominator = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def read_valid_labels(path: str) -> list[int]:
    """timm's --valid-labels file: one output index per line; scores are taken at these outputs, in this order."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--valid-labels {path} does not exist")
    lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        indices = [int(line) for line in lines]
    except ValueError:
        raise UsageError(f"--valid-labels {path}: each line must be one output index (an integer)") from None
    if not indices:
        raise UsageError(f"--valid-labels {path} lists no output index")
    return indices


def check_valid_labels(indices: Sequence[int], outputs: int, path: str) -> None:
    bad = [i for i in indices if not 0 <= i < outputs]
    if bad:
        raise UsageError(f"--valid-labels {path}: index {bad[0]} is not among the model's {outputs} outputs")


class RealLabels:
    """timm's ImageNet ReaL evaluation for the images of a split, given their file names by dataset index."""

    def __init__(self, real_json: str, name_of: Callable[[int], str], count: int, outputs: int) -> None:
        from timm.data import RealLabelsImagenet

        if not Path(real_json).is_file():
            raise UsageError(f"--real-labels {real_json} does not exist")
        names = [os.path.basename(name_of(i)) for i in range(count)]
        try:
            self.timm = RealLabelsImagenet(names, real_json=real_json, topk=(1, min(5, outputs)))
        except AssertionError:
            raise UsageError(
                f"--real-labels {real_json}: its labels are for a set of another size than this split's "
                f"{count} images (ReaL labels cover the 50,000 ILSVRC2012 validation images)"
            ) from None
        unknown = [name for name in names if name not in self.timm.real_labels]
        if unknown:
            raise UsageError(
                f"--real-labels: {unknown[0]} is not an ILSVRC2012 validation file name "
                "(ILSVRC2012_val_00000001.JPEG ...), so it has no real labels"
            )
        self.names = names

    def add(self, logits: torch.Tensor, indices: torch.Tensor) -> None:
        """Score one batch: ``indices`` are the dataset indices of its rows."""
        self.timm.filenames = [self.names[i] for i in indices.tolist()]
        self.timm.sample_idx = 0
        self.timm.add_result(logits)

    def accuracy(self, k: int) -> float:
        """Percent of the images with real labels whose top-k holds one (top-5 of fewer outputs: all of them)."""
        return self.timm.get_accuracy(k=min(k, self.timm.topk[-1]))
