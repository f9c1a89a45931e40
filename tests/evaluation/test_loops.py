"""Top-k counts exactly at the boundary, on every device: a label ranked k-th counts for top-k, one ranked
(k+1)-th does not. Random logits rarely put a label there, and with few classes every k covers them all,
so these logits are built to: for each k, one row with the label at rank k and one at rank k + 1."""

from __future__ import annotations

import pytest
import torch

from vtools.evaluation.loops import topk_correct

CLASSES = 10


def boundary_rows(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of distinct logits: label 3 ranked exactly k-th, then (k+1)-th (1-based)."""
    rows, targets = [], []
    for rank in (k, k + 1):
        logits = torch.arange(CLASSES, 0, -1, dtype=torch.float32)  # class c is ranked c + 1
        order = list(range(CLASSES))
        order.remove(3)
        order.insert(rank - 1, 3)  # class 3 moved to the wanted rank
        ranked = torch.empty(CLASSES)
        ranked[torch.tensor(order)] = logits
        rows.append(ranked)
        targets.append(3)
    return torch.stack(rows), torch.tensor(targets)


def reference(logits: torch.Tensor, targets: torch.Tensor, k: int) -> int:
    """Rows whose label has fewer than k logits above it."""
    above = (logits > logits.gather(1, targets[:, None])).sum(dim=1)
    return int((above < k).sum())


@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_label_ranked_k_counts_and_k_plus_one_does_not(device: torch.device, k: int) -> None:
    logits, targets = boundary_rows(k)
    assert reference(logits, targets, k) == 1  # the rows are what they claim to be
    for ks in ((k,), (k, CLASSES)):  # alone, and beside a larger k (the top-k computed once for both)
        assert int(topk_correct(logits.to(device), targets.to(device), ks=ks)[0]) == 1, ks
    first, second = (
        topk_correct(logits[i : i + 1].to(device), targets[i : i + 1].to(device), ks=(k,))[0] for i in (0, 1)
    )
    assert (int(first), int(second)) == (1, 0)


def test_top1_and_top5_together_and_k_beyond_the_classes(device: torch.device) -> None:
    logits = torch.cat([boundary_rows(k)[0] for k in (1, 5)])
    targets = torch.full((4,), 3)
    top1, top5, top_all = topk_correct(logits.to(device), targets.to(device), ks=(1, 5, CLASSES + 5))
    assert (int(top1), int(top5), int(top_all)) == (1, 3, 4)  # ranks 1, 2, 5, 6
