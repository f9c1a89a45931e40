"""Each loss flag's value reaches the number it changes: the loss train.py builds, on a fixed batch, equals
the formula with that value (written out here, not timm's class again), and another value gives another loss.
The type of the loss is tests/cli/test_train_flags.py's; this is its effect."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.cli.test_train_flags import train_flags
from vtools.train import recipe

CLASSES = 5


def batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(12, CLASSES, generator=generator) * 3
    return logits.to(device), torch.randint(0, CLASSES, (12,), generator=generator).to(device)


def loss_of(device: torch.device, *flags: str, mixup: bool = False) -> torch.nn.Module:
    return recipe.build_train_loss(train_flags(*flags).augment, mixup_active=mixup).to(device)


@pytest.mark.parametrize("smoothing", [0.05, 0.1, 0.3])
def test_smoothing_reaches_the_cross_entropy(device: torch.device, smoothing: float) -> None:
    logits, targets = batch(device)
    log_p = F.log_softmax(logits, dim=1)
    nll = -log_p.gather(1, targets[:, None]).squeeze(1)
    expected = ((1 - smoothing) * nll - smoothing * log_p.mean(dim=1)).mean()
    loss = loss_of(device, "--smoothing", str(smoothing))
    torch.testing.assert_close(loss(logits, targets), expected)
    other = loss_of(device, "--smoothing", str(smoothing / 2))
    assert not torch.allclose(other(logits, targets), expected)


def bce_targets(targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    off = smoothing / CLASSES
    return torch.full((len(targets), CLASSES), off, device=targets.device).scatter_(
        1, targets[:, None], 1 - smoothing + off
    )


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_smoothing_reaches_the_bce_targets(device: torch.device, smoothing: float) -> None:
    logits, targets = batch(device)
    loss = loss_of(device, "--bce-loss", "--smoothing", str(smoothing))
    expected = F.binary_cross_entropy_with_logits(logits, bce_targets(targets, smoothing))
    torch.testing.assert_close(loss(logits, targets), expected)


def test_bce_sum_threshold_and_positive_weight_reach_the_loss(device: torch.device) -> None:
    logits, targets = batch(device)
    soft = bce_targets(targets, 0.3)
    summed = loss_of(device, "--bce-loss", "--smoothing", "0.3", "--bce-sum")
    torch.testing.assert_close(
        summed(logits, targets), F.binary_cross_entropy_with_logits(logits, soft, reduction="none").sum(1).mean()
    )
    thresholded = loss_of(device, "--bce-loss", "--smoothing", "0.3", "--bce-target-thresh", "0.2")
    torch.testing.assert_close(
        thresholded(logits, targets), F.binary_cross_entropy_with_logits(logits, (soft > 0.2).float())
    )
    weighted = loss_of(device, "--bce-loss", "--smoothing", "0.3", "--bce-pos-weight", "4")
    pos_weight = torch.tensor(4.0, device=device)
    torch.testing.assert_close(
        weighted(logits, targets), F.binary_cross_entropy_with_logits(logits, soft, pos_weight=pos_weight)
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_smoothing_reaches_mixups_targets(device: torch.device, smoothing: float) -> None:
    """Every mixed row has a class in neither image's label, whose target is exactly smoothing / classes; the
    soft-target loss is then the cross-entropy against those rows."""
    job = train_flags("--mixup", "0.8", "--smoothing", str(smoothing))
    mixup = recipe.build_mixup(job.augment, CLASSES)
    logits, targets = batch(device)
    torch.manual_seed(0)
    _, mixed = mixup(torch.randn(12, 3, 8, 8, device=device), targets)
    torch.testing.assert_close(mixed.min(dim=1).values, torch.full((12,), smoothing / CLASSES, device=device))
    torch.testing.assert_close(mixed.sum(dim=1), torch.ones(12, device=device))
    loss = recipe.build_train_loss(job.augment, mixup_active=True).to(device)
    torch.testing.assert_close(loss(logits, mixed), -(mixed * F.log_softmax(logits, dim=1)).sum(1).mean())
