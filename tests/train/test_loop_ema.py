"""--model-ema in the training step: after every update the loop's EMA equals timm's ModelEmaV3 fed the
same weights, so an update that is skipped (or made a no-op) leaves weights this test sees."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from timm.utils import ModelEmaV3

from tests.cli.test_train_flags import train_flags
from vtools.data.loaders import Batch
from vtools.runtime.amp import resolve_amp
from vtools.runtime.distributed import DistInfo
from vtools.train.assemble import build_components
from vtools.train.loop import UpdatePoint, train_one_epoch

CLASSES, STEPS, BATCH = 3, 6, 8


def batches(device: torch.device) -> list[Batch]:
    generator = torch.Generator().manual_seed(5)
    return [
        Batch(
            torch.randn(BATCH, 3, 8, 8, generator=generator).to(device),
            torch.randint(0, CLASSES, (BATCH,), generator=generator).to(device),
            torch.arange(BATCH),
        )
        for _ in range(STEPS)
    ]


@pytest.mark.parametrize("warmup", [False, True])
def test_the_ema_follows_timms_after_every_update(device: torch.device, warmup: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4 * 36, CLASSES)
    ).to(device)
    flags = ["--model-ema", "--model-ema-decay", "0.8", "--opt", "sgd", "--lr", "0.5", "--sched", "none"]
    job = train_flags(*flags, *(["--model-ema-warmup"] if warmup else []))
    reference = ModelEmaV3(copy.deepcopy(model), decay=0.8, use_warmup=warmup)
    start = {name: value.clone() for name, value in model.state_dict().items()}
    loaders = SimpleNamespace(channels_last=False, updates_per_epoch=lambda accum: STEPS)
    parts, _, _ = build_components(job, model, loaders, CLASSES, device, resolve_amp(device, False), DistInfo())
    assert parts.ema is not None

    def follow(point: UpdatePoint) -> None:  # told after every update but the epoch's last
        reference.update(parts.model, step=point.num_updates)
        assert_same(parts.ema.module, reference.module)

    _, num_updates = train_one_epoch(parts, batches(device), 0, 0, show_progress=False, after_update=follow)
    reference.update(parts.model, step=num_updates)
    assert num_updates == STEPS
    assert_same(parts.ema.module, reference.module)
    ema = parts.ema.module.state_dict()
    moved = [name for name in start if start[name].is_floating_point() and not torch.equal(ema[name], start[name])]
    assert moved, "the EMA never left the initial weights"
    trained = model.state_dict()
    assert not all(torch.equal(ema[name], trained[name]) for name in moved), "the EMA is the model itself"


def assert_same(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    expected = theirs.state_dict()
    for name, value in ours.state_dict().items():
        assert torch.equal(value, expected[name]), name
