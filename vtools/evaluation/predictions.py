"""Each evaluated sample's outcome, kept on the device while the pass runs and gathered once at its end.

Per-class tables, the confusion matrix, calibration and the list of mistakes
all derive from five numbers per sample: its label, the top-1 prediction, how
many classes scored above the label (so top-k of any k), the top-1
probability and the label's probability. ``PredictionLog.add`` computes them
per batch on the device with no host sync; ``gather`` stacks every rank's rows
(each sample once, as the validation shards hold it once) and brings them to
the host in one copy per dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vtools.runtime.distributed import gather_rows


@dataclass(frozen=True)
class Predictions:
    """Host arrays, one entry per evaluated sample (all ranks), in rank then batch order."""

    index: np.ndarray  # dataset index
    target: np.ndarray
    predicted: np.ndarray  # argmax
    target_rank: np.ndarray  # classes scored strictly above the label: top-k holds the label when < k
    confidence: np.ndarray  # top-1 probability
    target_prob: np.ndarray  # the label's probability

    def __len__(self) -> int:
        return len(self.target)

    @property
    def correct(self) -> np.ndarray:
        return self.predicted == self.target


class PredictionLog:
    """Collects :class:`Predictions` from ``evaluate``'s ``on_logits`` hook."""

    def __init__(self) -> None:
        self._outcomes: list[torch.Tensor] = []  # int64 per batch: target, predicted, target rank
        self._probs: list[torch.Tensor] = []  # float32 per batch: confidence, target probability
        self._indices: list[torch.Tensor] = []  # on the host, as the loader made them

    def add(self, logits: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        logits = logits.float()
        probs = logits.softmax(dim=1)
        confidence, predicted = probs.max(dim=1)
        target_logit = logits.gather(1, targets.unsqueeze(1))
        target_rank = (logits > target_logit).sum(dim=1)
        self._outcomes.append(torch.stack([targets, predicted, target_rank], dim=1))
        self._probs.append(torch.stack([confidence, probs.gather(1, targets.unsqueeze(1)).squeeze(1)], dim=1))
        self._indices.append(indices.reshape(-1).to(torch.int64))

    def gather(self, device: torch.device) -> Predictions:
        """Every rank's samples on every rank (a collective: all ranks call it)."""
        outcomes = torch.cat(self._outcomes) if self._outcomes else torch.zeros(0, 3, dtype=torch.int64, device=device)
        probs = torch.cat(self._probs) if self._probs else torch.zeros(0, 2, device=device)
        indices = torch.cat(self._indices) if self._indices else torch.zeros(0, dtype=torch.int64)
        rows = torch.cat([indices.to(outcomes.device).unsqueeze(1), outcomes], dim=1)
        rows, probs = gather_rows(rows).cpu().numpy(), gather_rows(probs).cpu().numpy()
        return Predictions(
            index=rows[:, 0],
            target=rows[:, 1],
            predicted=rows[:, 2],
            target_rank=rows[:, 3],
            confidence=probs[:, 0].astype(np.float64),
            target_prob=probs[:, 1].astype(np.float64),
        )
