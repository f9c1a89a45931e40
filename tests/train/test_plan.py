"""The run plan (vtools/train/plan.py): what a run will do, decided from the job, the device and the data
before the loaders, the optimizer and the schedule exist, and what the builders then build."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import write_image_set
from vtools.cli.train_flags import parse, typed
from vtools.runtime import device as dev
from vtools.runtime.distributed import DistInfo
from vtools.runtime.resolve import setup_runtime
from vtools.train import recipe
from vtools.train.assemble import build_datasets
from vtools.train.plan import plan_run


def image_folders(root: Path) -> Path:
    for split in ("train", "validation"):
        write_image_set(root / split, ["a", "b", "c"])
    return root


def planned(data: Path, device: torch.device, model_name: str, *flags: str):
    job = typed(parse([str(data), "--device", device.type, "--model", model_name, "--workers", "0", *flags]))
    runtime = setup_runtime(job.runtime)
    model = timm.create_model(model_name, num_classes=3)
    train, _, _ = build_datasets(job.data)
    return job, runtime, model, plan_run(job, runtime, model, 32, train, DistInfo(0, 2))


def test_the_rate_is_scaled_to_the_global_batch_before_any_optimizer(device: torch.device, tmp_path: Path) -> None:
    """--lr-base 0.1 over --lr-base-size 64 at 8 per step, 2 steps per update, 2 processes: a global batch of
    32, and adamw's square-root rule gives 0.1 * sqrt(32 / 64)."""
    data = image_folders(tmp_path)
    flags = ("--batch-size", "8", "--grad-accum-steps", "2", "--opt", "adamw", "--lr-base", "0.1")
    job, _, model, plan = planned(data, device, "resnet10t", *flags, "--lr-base-size", "64")
    assert plan.global_batch == 32
    assert plan.lr == pytest.approx(0.1 * (32 / 64) ** 0.5)
    optimizer = recipe.build_optimizer(model, job.optim, plan.lr)  # the builder takes the plan's rate
    assert recipe.mean_lr(optimizer) == pytest.approx(plan.lr)
    assert plan.loader.img_size == 32 and plan.loader.data_path == str(data)


def test_the_device_defaults_are_the_plans_and_the_builders_agree(device: torch.device, tmp_path: Path) -> None:
    """Without --channels-last or --opt-kwargs fused, the device chooses; the plan says so, and the optimizer
    the builder makes takes the step the plan named. Given flags, the plan says nothing of defaults."""
    data = image_folders(tmp_path)
    job, runtime, model, plan = planned(data, device, "resnet10t", "--opt", "adamw", "--lr", "0.01")
    assert plan.channels_last == dev.kind_of(device.type).channels_last  # resnet10t is a convnet
    assert recipe.fused_step(recipe.build_optimizer(model.to(device), job.optim, plan.lr)) == plan.fused_step
    line = plan.device_defaults_line(device.type)
    layout = "channels-last" if plan.channels_last else "channels-first"
    assert line.startswith(f"{device.type} defaults: {layout} layout and ")
    assert ("fused optimizer step" if plan.fused_step else "per-tensor optimizer step") in line
    given = ("--opt", "adamw", "--lr", "0.01", "--channels-last", "--opt-kwargs", "fused=False")
    _, _, _, chosen = planned(data, device, "resnet10t", *given)
    assert (chosen.channels_last, chosen.fused_step, chosen.device_defaults_line(device.type)) == (True, False, "")


def test_a_vit_keeps_the_channels_first_layout(device: torch.device, tmp_path: Path) -> None:
    """The device's channels-last default is for convnets: a ViT is planned channels-first on every device."""
    data = image_folders(tmp_path)
    flags = ("--lr", "0.01", "--model-kwargs", "img_size=32", "patch_size=16", "depth=1", "embed_dim=48", "num_heads=2")
    _, _, _, plan = planned(data, device, "vit_tiny_patch16_224", *flags)
    assert plan.channels_last is False


@pytest.mark.parametrize(
    "flags",
    [
        ("--batch-size", "4", "--grad-accum-steps", "2"),  # 3 batches: the last update takes one
        ("--batch-size", "3", "--grad-accum-steps", "2", "--aug-repeats", "3"),
        ("--batch-size", "2", "--grad-accum-steps", "3", "--balanced-sampler", "--sched-on-updates"),
        ("--batch-size", "4", "--epochs", "5", "--cooldown-epochs", "2", "--warmup-prefix", "--warmup-epochs", "1"),
    ],
    ids=["plain", "repeats", "balanced", "cooldown"],
)
def test_the_epochs_counts_are_what_the_loaders_and_schedule_then_build(
    device: torch.device, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """The plan counts an epoch's batches and updates, and timm's schedule length, before anything is built;
    the loaders and the schedule built afterwards have exactly those counts."""
    from vtools.runtime.distributed import DistInfo
    from vtools.train.assemble import build_components, build_loaders

    data = image_folders(tmp_path)
    job, runtime, model, _ = planned(data, device, "resnet10t", "--lr", "0.01", *flags)
    plan = plan_run(job, runtime, model, 32, build_datasets(job.data)[0], DistInfo())
    train, val, _ = build_datasets(job.data)
    model = model.to(device)
    loaders = build_loaders(job, model, train, val, device, DistInfo(), 0, channels_last=plan.channels_last)
    assert len(loaders.train) == plan.batches_per_epoch
    assert loaders.updates_per_epoch(job.optim.grad_accum_steps) == plan.updates_per_epoch
    built = build_components(job, model, loaders, 3, device, runtime.amp, DistInfo())  # decided there, alone
    assert (built[1], built[2]) == (plan.lr, plan.num_epochs)
