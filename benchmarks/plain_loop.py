"""The plain training loop ``python3 -m benchmarks --tasks recipe`` measures vtools' train.py against.

It does the work of timm's ``train.py`` the way that script does it, with no
vtools code in the loop: a timm model, timm's training and eval transforms
(normalizing in the loader workers), torchvision's ``ImageFolder`` and
``DataLoader`` (shuffled, persistent workers),
``create_optimizer_v2``, ``create_scheduler_v2`` stepped per update and after
validation, label smoothing, autocast (and a GradScaler for float16) when
``--amp``, the loss read back each step, top-1/top-5 validation after every
epoch and a checkpoint saved each epoch. It takes the subset of timm's flags
the bench passes to both. Two choices come from vtools so that the comparison
is about the loop, not the set-up: the device spec (``auto`` included) and the
worker count (vtools' cpu budget; timm's default of 4 would oversubscribe a
small host).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torchvision
from timm import create_model
from timm.data import create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import accuracy

from benchmarks.options import BenchOptions
from vtools.runtime.amp import resolve_amp
from vtools.runtime.cpu_budget import plan, usable_cores
from vtools.runtime.device import resolve_device


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plain_loop", description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--img-size", type=int, default=None)
    parser.add_argument("--crop-pct", type=float, default=None)
    parser.add_argument("--batch-size", "-b", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--opt", default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=2e-5)
    parser.add_argument("--sched", default="cosine")
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--warmup-lr", type=float, default=1e-5)
    parser.add_argument("--min-lr", type=float, default=0.0)
    parser.add_argument("--smoothing", type=float, default=0.1)
    parser.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0])
    parser.add_argument("--ratio", type=float, nargs=2, default=[3 / 4, 4 / 3])
    parser.add_argument("--hflip", type=float, default=0.5)
    parser.add_argument("--color-jitter", type=float, default=0.4)
    parser.add_argument("--train-interpolation", default="random")
    parser.add_argument("--interpolation", default="")
    parser.add_argument("--workers", "-j", type=int, default=None)
    parser.add_argument("--pin-mem", action="store_true", default=False)
    parser.add_argument("--amp", action="store_true", default=False)
    parser.add_argument("--amp-dtype", default="float16", choices=("auto", "bfloat16", "float16"))
    parser.add_argument("--channels-last", action="store_true", default=False)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", required=True, help="folder for last.pth.tar and summary.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    workers = plan(device.type, len(usable_cores())).workers if args.workers is None else args.workers
    data_dir = Path(args.data_dir)
    classes = sorted(p.name for p in (data_dir / "train").iterdir() if p.is_dir())
    model = create_model(args.model, num_classes=len(classes)).to(device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    overrides = {
        "input_size": (3, args.img_size, args.img_size) if args.img_size else None,
        "crop_pct": args.crop_pct,
        "interpolation": args.interpolation or None,
    }
    config = resolve_data_config({k: v for k, v in overrides.items() if v is not None}, model=model)
    train_tf = create_transform(
        config["input_size"],
        is_training=True,
        scale=args.scale,
        ratio=args.ratio,
        hflip=args.hflip,
        color_jitter=args.color_jitter,
        interpolation=args.train_interpolation,
        mean=config["mean"],
        std=config["std"],
    )
    eval_tf = create_transform(**config)
    train_set = torchvision.datasets.ImageFolder(str(data_dir / "train"), transform=train_tf)
    val_set = torchvision.datasets.ImageFolder(str(data_dir / "val"), transform=eval_tf)
    loader_args = {
        "batch_size": args.batch_size,
        "num_workers": workers,
        "pin_memory": args.pin_mem,
        "persistent_workers": workers > 0,
    }
    train_loader = torch.utils.data.DataLoader(train_set, shuffle=True, drop_last=True, **loader_args)
    val_loader = torch.utils.data.DataLoader(val_set, **loader_args)
    optimizer = create_optimizer_v2(model, args.opt, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer,
        args.sched,
        num_epochs=args.epochs,
        warmup_epochs=args.warmup_epochs,
        warmup_lr=args.warmup_lr,
        min_lr=args.min_lr,
        updates_per_epoch=len(train_loader),
    )
    train_loss = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing else torch.nn.CrossEntropyLoss()
    amp = resolve_amp(device, args.amp, args.amp_dtype)
    autocast = lambda: torch.autocast(device.type, dtype=amp.dtype, enabled=args.amp)  # noqa: E731
    scaler = torch.amp.GradScaler(device.type) if args.amp and amp.dtype == torch.float16 else None
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rows, num_updates = [], 0
    for epoch in range(num_epochs):
        model.train()
        start, seen, loss_sum = time.perf_counter(), 0, 0.0
        for images, targets in train_loader:
            images, targets = images.to(device), targets.to(device)
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with autocast():
                loss = train_loss(model(images), targets)
            optimizer.zero_grad()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            num_updates += 1
            scheduler.step_update(num_updates=num_updates)
            loss_sum += loss.item() * len(targets)
            seen += len(targets)
        seconds = time.perf_counter() - start
        metrics = validate(model, val_loader, device, autocast, args.channels_last)
        scheduler.step(epoch + 1, metrics["top1"])
        torch.save(
            {"epoch": epoch, "arch": args.model, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},
            out / "last.pth.tar",
        )
        rows.append({"epoch": epoch, "train_loss": loss_sum / seen, **metrics, "img_per_sec": seen / seconds})
        print(
            f"epoch {epoch}: train_loss {rows[-1]['train_loss']:.4f} top1 {metrics['top1']:.2f} "
            f"{seen / seconds:.1f} img/s",
            flush=True,
        )
    (out / "summary.json").write_text(json.dumps(rows))
    return 0


@torch.inference_mode()
def validate(
    model: torch.nn.Module, loader: Any, device: torch.device, autocast: Any, channels_last: bool
) -> dict[str, float]:
    model.eval()
    loss_fn = torch.nn.CrossEntropyLoss()
    count, loss_sum, top1_sum, top5_sum = 0, 0.0, 0.0, 0.0
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast():
            output = model(images)
        top1, top5 = accuracy(output, targets, topk=(1, min(5, output.shape[1])))
        loss_sum += loss_fn(output.float(), targets).item() * len(targets)
        top1_sum += top1.item() * len(targets)
        top5_sum += top5.item() * len(targets)
        count += len(targets)
    return {"eval_loss": loss_sum / count, "top1": top1_sum / count, "top5": top5_sum / count}


def baseline_step(task: str, model: Any, amp: Any) -> Any:
    """What a user writes without vtools: a plain SGD step, or a forward pass (+ top-5 for inference)."""
    import torch
    import torch.nn.functional as F

    if task == "train":
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        scaler = amp.grad_scaler()

        def train_step(images: torch.Tensor, targets: torch.Tensor) -> None:
            with amp.autocast():
                loss = F.cross_entropy(model(images), targets)
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return train_step
    model.eval()

    @torch.inference_mode()
    def eval_step(images: torch.Tensor, targets: torch.Tensor) -> None:
        with amp.autocast():
            logits = model(images)
        if task == "inference":
            logits.float().softmax(1).topk(5)

    return eval_step


def baseline_batches(task: str, options: BenchOptions, model: Any, device: Any, workers: int) -> Any:
    """ImageFolder + timm transform (normalizing in the workers) + DataLoader, .to(device) per batch."""
    import torch
    import torchvision
    from timm.data import create_transform, resolve_data_config

    from vtools.data.readers.folder import resolve_split_dir

    config = resolve_data_config(model=model)
    transform = create_transform(**config, is_training=task == "train")
    root = resolve_split_dir(options.data, "train" if task == "train" else "validation")
    dataset = torchvision.datasets.ImageFolder(str(root), transform=transform)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=options.batch_size,
        shuffle=task == "train",
        num_workers=workers,
        drop_last=task == "train",
        persistent_workers=workers > 0,
    )
    for images, targets in epochs_of(loader):
        images = images.to(device)
        if options.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        yield images, targets.to(device)


def epochs_of(loader: Any) -> Any:
    """A loader's batches, epoch after epoch (a sampler with epochs gets the next one each time)."""
    sampler = getattr(getattr(loader, "loader", None), "sampler", None)
    epoch = 0
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


if __name__ == "__main__":
    sys.exit(main())
