"""--early-stop-patience: whether a run stops because --eval-metric has stopped improving, and why.

The decision is read from the run's summary.csv rows (:attr:`~vtools.train.run.TrainingRun.summary_rows`),
never from a counter of its own: a resumed run reads those rows back, so it remembers how long it has
waited without anything new in the checkpoint. As Keras' and Lightning's ``EarlyStopping``, patience
counts validations, not epochs: an epoch that --val-interval skips (its ``eval_<metric>`` cell is empty)
neither improves nor waits. A value improves when it beats the reference by MORE than ``min_delta`` in
the metric's direction (:func:`~vtools.evaluation.best_epoch.higher_is_better`: every metric but the
loss); the reference is the last value that improved, so small gains that add up do not reset the wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vtools.evaluation.best_epoch import higher_is_better


@dataclass(frozen=True)
class Waited:
    """Where a run stands: the reference value, its epoch, and the validations since without improvement."""

    best: float | None
    best_epoch: int | None
    validations: int
    last_epoch: int | None  # the last row's epoch (None: no rows)


@dataclass(frozen=True)
class EarlyStop:
    """The rule of --early-stop-patience and --early-stop-min-delta on --eval-metric ``metric``."""

    metric: str  # top1, top5 or loss
    patience: int  # validations without improvement that stop the run (0: never)
    min_delta: float  # how much a value must beat the reference by to count as an improvement

    def waited(self, rows: Sequence[Mapping[str, Any]]) -> Waited:
        """How long the run has waited, from its summary.csv rows in epoch order (floats, or the text a
        resumed run read back; '' where the epoch was not validated)."""
        higher = higher_is_better(self.metric)
        best: float | None = None
        best_epoch = last_epoch = None
        validations = 0
        for row in rows:
            last_epoch = int(row["epoch"])
            cell = row.get(f"eval_{self.metric}", "")
            if cell is None or cell == "":
                continue
            value = float(cell)
            change = value - best if best is not None else 0.0
            if best is None or (change > self.min_delta if higher else -change > self.min_delta):
                best, best_epoch, validations = value, last_epoch, 0
            else:
                validations += 1
        return Waited(best, best_epoch, validations, last_epoch)

    def verdict(self, rows: Sequence[Mapping[str, Any]], num_epochs: int) -> str | None:
        """Why the run stops after its last row's epoch, or None: patience off, still patient, or no
        epoch left to skip (the run ends there anyway)."""
        if self.patience <= 0:
            return None
        waited = self.waited(rows)
        if waited.last_epoch is None or waited.last_epoch + 1 >= num_epochs or waited.validations < self.patience:
            return None
        return (
            f"early stop: {self.metric} has not improved by more than {self.min_delta:g} for "
            f"{waited.validations} validated epoch(s) since {waited.best:.4g} at epoch {waited.best_epoch}; "
            f"stopped after epoch {waited.last_epoch} of {num_epochs} (epochs count from 0)"
        )


def early_stop_of(metric: str, patience: int, min_delta: float) -> EarlyStop | None:
    """The run's rule, or None where --early-stop-patience is 0 (off)."""
    return EarlyStop(metric, patience, min_delta) if patience > 0 else None
