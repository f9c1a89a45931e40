"""Pictures of a class report: the confusion matrix and the reliability diagram, drawn from its csv files.

Drawn from the files rather than from memory, so a run draws them once at its
end, and a report can be redrawn. The confusion picture stays legible at any
class count: up to ``FULL_MATRIX_MAX`` classes it shows the whole matrix; beyond
that, the classes of the most frequent mistakes (at most ``FOCUS_CLASSES``).
Cells are coloured by their share of the label's samples and carry counts.
matplotlib comes with requirements.txt.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vtools.errors import UsageError
from vtools.evaluation.class_report import Confusion
from vtools.evaluation.report_files import CALIBRATION, OVERALL, read_confusion, read_table
from vtools.observe.figures import pyplot, save_png

FULL_MATRIX_MAX = 30
FOCUS_CLASSES = 20
CONFUSION_PNG = "confusion.png"
RELIABILITY_PNG = "reliability.png"


def draw_report(folder: Path, before_write: Callable[[Path], None] | None = None) -> list[Path]:
    """confusion.png and reliability.png in the report ``folder``; ``before_write(path)`` first."""
    plt = pyplot("drawing a class report")
    written = []
    for name, draw in ((CONFUSION_PNG, _confusion_figure), (RELIABILITY_PNG, _reliability_figure)):
        figure = draw(plt, folder)
        if before_write is not None:
            before_write(folder / name)
        written.append(save_png(figure, folder / name))
    return written


def draw_report_or_why_not(folder: Path, before_write: Callable[[Path], None] | None = None) -> str | None:
    """Draw the report's pictures (:func:`draw_report`); None when drawn, else why there are none (a
    plotting library missing): the report's tables stand without them."""
    try:
        draw_report(folder, before_write)
    except UsageError as missing:
        return str(missing)
    return None


def focus_classes(confusion: Confusion) -> list[int]:
    """Every class when there are few; otherwise the classes of the most frequent mistakes, in the
    order those mistakes rank (a pair's label, then its prediction)."""
    if confusion.num_classes <= FULL_MATRIX_MAX:
        return list(range(confusion.num_classes))
    true, predicted, counts = confusion.errors()
    chosen: list[int] = []
    for i in np.lexsort((predicted, true, -counts)):
        for index in (int(true[i]), int(predicted[i])):
            if index not in chosen and len(chosen) < FOCUS_CLASSES:
                chosen.append(index)
        if len(chosen) >= FOCUS_CLASSES:
            break
    return chosen or list(range(min(FOCUS_CLASSES, confusion.num_classes)))


def _confusion_figure(plt: Any, folder: Path) -> Any:
    classes, confusion = read_confusion(folder)
    keep = focus_classes(confusion)
    matrix = confusion.dense(keep)
    support = confusion.class_counts()[2][keep]
    share = matrix / np.maximum(support, 1)[:, None]
    names = [classes[i] for i in keep]
    side = max(4.5, 0.42 * len(keep) + 2.5)
    figure, axis = plt.subplots(figsize=(side + 1.2, side))
    image = axis.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    for row in range(len(keep)):
        for column in range(len(keep)):
            if matrix[row, column]:
                dark = share[row, column] > 0.55
                axis.text(
                    column, row, str(matrix[row, column]), ha="center", va="center", fontsize=8,
                    color="white" if dark else "black",
                )  # fmt: skip
    axis.set_xticks(range(len(keep)), names, rotation=45, ha="right", fontsize=8)
    axis.set_yticks(range(len(keep)), names, fontsize=8)
    axis.set_xlabel("predicted")
    axis.set_ylabel("label")
    title = "confusion matrix" if len(keep) == confusion.num_classes else (
        f"the {len(keep)} classes of the most frequent mistakes (of {confusion.num_classes})"
    )  # fmt: skip
    axis.set_title(title, fontsize=10)
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04, label="share of the label's images")
    figure.tight_layout()
    return figure


def _reliability_figure(plt: Any, folder: Path) -> Any:
    bins = read_table(folder / CALIBRATION)
    overall = read_table(folder / OVERALL)[0]
    low = np.array([float(b["low"]) for b in bins])
    width = np.array([float(b["high"]) for b in bins]) - low
    count = np.array([int(b["count"]) for b in bins])
    accuracy = np.array([float(b["accuracy"]) / 100 if b["accuracy"] else 0.0 for b in bins])
    confidence = np.array([float(b["confidence"]) / 100 if b["confidence"] else 0.0 for b in bins])
    figure, (axis, hist) = plt.subplots(2, 1, figsize=(5.2, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    filled = count > 0
    axis.bar(
        low[filled], accuracy[filled], width=width[filled], align="edge", edgecolor="black", label="accuracy in the bin"
    )
    centre = low[filled] + width[filled] / 2
    axis.plot(centre, confidence[filled], "o-", color="tab:red", markersize=4, label="mean confidence")
    axis.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    axis.set_ylim(0, 1)
    axis.set_ylabel("accuracy")
    axis.set_title(f"reliability: ECE {float(overall['ece']):.2f}% over {overall['samples']} images", fontsize=10)
    axis.legend(fontsize=8, loc="upper left")
    hist.bar(low, count, width=width, align="edge", color="gray", edgecolor="black")
    hist.set_xlabel("top-1 confidence")
    hist.set_ylabel("images")
    hist.set_xlim(0, 1)
    figure.tight_layout()
    return figure
