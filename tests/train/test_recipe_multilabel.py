"""Multi-label training: the loss and mixup the recipe builds for multi-hot targets (timm's BCE and timm's
multi-label mixup), --smoothing reaching the number it changes. Whole runs: tests/scripts/test_multilabel.py."""

from __future__ import annotations

import pytest
import torch
from timm.data.mixup import mixup_target
from timm.loss import BinaryCrossEntropy

from tests.cli.test_train_flags import train_flags
from vtools.train import recipe


def multi_hot(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 4, generator=generator)
    targets = (torch.rand(8, 4, generator=generator) < 0.4).float()
    return logits.to(device), targets.to(device)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_the_loss_is_timms_bce_with_each_label_smoothed_towards_half(device: torch.device, smoothing: float) -> None:
    logits, targets = multi_hot(device)
    job = train_flags("--smoothing", str(smoothing))
    loss = recipe.build_train_loss(job.augment, mixup_active=False, multi_label=True).to(device)
    smoothed = targets * (1 - smoothing) + 0.5 * smoothing
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, smoothed)
    torch.testing.assert_close(loss(logits, targets), expected)
    torch.testing.assert_close(
        loss(logits, targets), BinaryCrossEntropy(smoothing=smoothing, smooth_dense=True).to(device)(logits, targets)
    )


def test_under_mixup_timm_mixes_and_smooths_and_the_loss_does_not_smooth_again(device: torch.device) -> None:
    logits, targets = multi_hot(device)
    job = train_flags("--mixup", "0.8", "--smoothing", "0.1")
    mixup = recipe.build_mixup(job.augment, 4, multi_label=True)
    assert mixup is not None and mixup.multi_label
    torch.manual_seed(0)
    _, mixed = mixup(torch.randn(8, 3, 8, 8, device=device), targets)
    assert mixed.shape == targets.shape
    loss = recipe.build_train_loss(job.augment, mixup_active=True, multi_label=True).to(device)
    torch.testing.assert_close(loss(logits, mixed), torch.nn.functional.binary_cross_entropy_with_logits(logits, mixed))
    # the mixed targets are timm's for some lam: y * lam + y.flip(0) * (1 - lam), each smoothed by 0.1
    smoothed = targets * 0.9 + 0.05
    lam = ((mixed - smoothed.flip(0)) / (smoothed - smoothed.flip(0))).nan_to_num(nan=0.0)
    candidates = lam[(smoothed - smoothed.flip(0)).abs() > 0]
    assert torch.allclose(candidates, candidates[0].expand_as(candidates), atol=1e-5)
    torch.testing.assert_close(mixed, mixup_target(targets, 4, float(candidates[0]), 0.1, multi_label=True))
