"""Which epoch is best: the rule the checkpoint manager keeps ``model_best`` by and the curves mark.

One rule for both, so the epoch a plot marks is the epoch whose weights were kept:
every --eval-metric is a score (higher is better) except the loss, and a tie does
not replace the best, so the first epoch to reach the best value stays best.
"""

from __future__ import annotations

from collections.abc import Sequence


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of --eval-metric ``metric`` is better (every metric but the loss)."""
    return metric != "loss"


def metric_text(metric: str, value: float) -> str:
    """``top1 84.33``: the precision the epoch lines print the metric with (a score two decimals, the loss
    four), so the best epoch's figure reads as the one its epoch line showed."""
    return f"{metric} {value:.{2 if higher_is_better(metric) else 4}f}"


def improves(value: float, best: float | None, higher: bool) -> bool:
    """Whether ``value`` beats ``best`` (None: no best yet); a tie does not."""
    if best is None:
        return True
    return value > best if higher else value < best


def best_epoch_of(epochs: Sequence[int], values: Sequence[float], higher: bool) -> int | None:
    """The first of ``epochs`` whose value no later epoch beats; None when there are none."""
    best: float | None = None
    chosen = None
    for epoch, value in zip(epochs, values):
        if improves(value, best, higher):
            best, chosen = value, epoch
    return chosen
