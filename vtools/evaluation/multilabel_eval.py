"""Validating a multi-label model: its scores collected while the pass runs, scored once at its end.

mAP and best-F1 thresholds need every sample's scores at once (a ranking per class), so unlike top-k they
cannot be summed batch by batch. :class:`ScoreLog` keeps each batch's sigmoid scores and multi-hot targets
on the device (no host sync per batch) and gathers every rank's rows at the end; :func:`scored` turns them
into the report (vtools.evaluation.multilabel_metrics) and the run's figures, and
:func:`write_multilabel_report` writes its tables where a single-label run writes its class report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from vtools.evaluation.loops import EvalResult
from vtools.evaluation.multilabel_metrics import MultiLabelReport, multilabel_report
from vtools.evaluation.report_files import OVERALL, PER_CLASS
from vtools.results import write_rows
from vtools.runtime.distributed import gather_rows


@dataclass(frozen=True)
class Scores:
    """Host arrays over every evaluated sample (all ranks): dataset index, N x K scores, N x K targets."""

    index: np.ndarray
    scores: np.ndarray
    targets: np.ndarray


class ScoreLog:
    """Collects each batch's sigmoid scores and targets from ``evaluate``'s ``on_logits`` hook."""

    def __init__(self) -> None:
        self._rows: list[torch.Tensor] = []  # float32 per batch: K scores, then K targets
        self._indices: list[torch.Tensor] = []  # int64 per batch

    def add(self, logits: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        self._rows.append(torch.cat([logits.float().sigmoid(), targets.float()], dim=1))
        self._indices.append(indices.reshape(-1, 1).to(device=logits.device, dtype=torch.int64))

    __call__ = add

    def gather(self, device: torch.device, num_classes: int) -> Scores:
        """Every rank's samples on every rank (a collective: all ranks call it)."""
        rows = torch.cat(self._rows) if self._rows else torch.zeros(0, 2 * num_classes, device=device)
        index = torch.cat(self._indices) if self._indices else torch.zeros(0, 1, dtype=torch.int64, device=device)
        rows, index = gather_rows(rows).cpu().numpy(), gather_rows(index).cpu().numpy()
        return Scores(index[:, 0], rows[:, :num_classes], rows[:, num_classes:].astype(np.uint8))


def scored(
    result: EvalResult, scores: Scores, threshold: float, class_names: Sequence[str]
) -> tuple[EvalResult, MultiLabelReport]:
    """``result`` with its mAP (macro, micro) and F1 macro at ``threshold``, in percent, and the report."""
    report = multilabel_report(scores.scores, scores.targets, threshold, list(class_names))
    figures = replace(result, map=100 * report.map_macro, map_micro=100 * report.map_micro, f1=100 * report.f1_macro)
    return figures, report


def write_multilabel_report(
    folder: Path, report: MultiLabelReport, about: dict[str, object], before_write: Callable[[Path], None] | None = None
) -> None:
    """per_class.csv (AP, precision, recall, F1 at the threshold, the best-F1 threshold, support) and
    overall.csv (the averages, with ``about``: which epoch or model) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in ((PER_CLASS, report.rows()), (OVERALL, [{**about, **report.overall()}])):
        if before_write is not None:
            before_write(folder / name)
        write_rows(folder / name, rows, "csv")


def above_threshold(
    outputs: Iterable[tuple], threshold: float, output_type: str
) -> Iterator[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]]:
    """Each image's classes whose probability is at least ``threshold`` (logits: their sigmoid), most
    probable first, with their scores: batches of every class's scores become per-image lists."""
    for indices, scores, _ in outputs:
        probs = scores.sigmoid() if output_type == "logit" else scores
        order = probs.argsort(dim=1, descending=True, stable=True)
        chosen = [row_order[probs[row, row_order] >= threshold] for row, row_order in enumerate(order)]
        yield indices, [scores[row, classes] for row, classes in enumerate(chosen)], chosen
