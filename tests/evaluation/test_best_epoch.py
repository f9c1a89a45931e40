"""The best-epoch rule (vtools/evaluation/best_epoch.py): the checkpoint manager keeps best by it and the curves
mark the epoch it picks, so the two can never name different epochs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from vtools.evaluation.best_epoch import best_epoch_of, higher_is_better, improves, metric_text
from vtools.observe.curves import best_epoch
from vtools.train.checkpoint import CheckpointManager

pytestmark = pytest.mark.cpu_only(reason="pure host-side rules")

SERIES = {
    "top1": [50.0, 70.0, 70.0, 65.0],  # a tie: the first epoch to reach 70 stays best
    "loss": [2.0, 1.5, 1.5, 1.7],
}


def test_the_rule() -> None:
    assert higher_is_better("top1") and higher_is_better("top5") and not higher_is_better("loss")
    assert improves(1.0, None, True) and improves(0.5, 1.0, False) and not improves(1.0, 1.0, True)
    assert best_epoch_of([0, 1, 2, 3], SERIES["top1"], True) == 1
    assert best_epoch_of([0, 1, 2, 3], SERIES["loss"], False) == 1
    assert best_epoch_of([], [], True) is None
    assert best_epoch_of([0, 1, 2], [1.0, math.nan, 2.0], True) == 2  # as max() over the same values


@pytest.mark.parametrize("metric", sorted(SERIES))
def test_checkpoints_and_curves_pick_the_same_epoch(metric: str, tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", higher_is_better=higher_is_better(metric))
    for epoch, value in enumerate(SERIES[metric]):
        if manager.is_better(value):
            manager.best_metric, manager.best_epoch = value, epoch
    (tmp_path / "config.yaml").write_text(f"eval_metric: {metric}\n", encoding="utf-8")
    rows = [{"epoch": str(epoch), f"eval_{metric}": str(value)} for epoch, value in enumerate(SERIES[metric])]
    with open(tmp_path / "summary.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert best_epoch(tmp_path, rows) == manager.best_epoch == 1


def test_the_best_figure_reads_as_its_epoch_line() -> None:
    """The run's end said ``best top1 84.3333`` under epoch lines of ``top1 84.33``."""
    assert metric_text("top1", 84.33333) == "top1 84.33"
    assert metric_text("top5", 86.0) == "top5 86.00"
    assert metric_text("loss", 0.50234) == "loss 0.5023"
