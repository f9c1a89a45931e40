"""A training recipe from timm's building blocks: optimizer, scheduler, loss, mixup, EMA, augmentation.

Nothing here is re-implemented: each function maps train.py's options (timm's
flag names) onto the timm factory that owns the job.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import torch
from timm.data import Mixup, create_transform
from timm.data.random_erasing import RandomErasing
from timm.loss import (
    BinaryCrossEntropy,
    LabelSmoothingCrossEntropy,
    SoftTargetCrossEntropy,
)
from timm.optim import create_optimizer_v2, get_optimizer_info, optimizer_kwargs
from timm.scheduler import create_scheduler_v2, scheduler_kwargs
from timm.utils import ModelEmaV3

from vtools.cli.train_flags import mixup_requested
from vtools.data import augment_ops
from vtools.errors import UsageError
from vtools.runtime import device as dev


def scaled_lr(args: argparse.Namespace, global_batch_size: int) -> float:
    """--lr, or --lr-base scaled by global batch size / --lr-base-size (sqrt for adaptive optimizers)."""
    if args.lr is not None:
        return args.lr
    ratio = global_batch_size / args.lr_base_size
    scale = args.lr_base_scale or ("sqrt" if any(name in args.opt.lower() for name in ("ada", "lamb")) else "linear")
    return args.lr_base * (ratio**0.5 if scale == "sqrt" else ratio)


def build_optimizer(model: torch.nn.Module, args: argparse.Namespace, lr: float) -> torch.optim.Optimizer:
    """timm's optimizer for the flags; its fused step where torch has one for the optimizer and device
    (one pass over the weights instead of one per tensor and operation)."""
    kwargs = {**optimizer_kwargs(args), **args.opt_kwargs}
    kwargs["lr"] = lr
    if dev.fused_optimizer(next(model.parameters()).device) and _accepts_fused(args.opt):
        kwargs["fused"] = True
    return create_optimizer_v2(model, **kwargs)


def _accepts_fused(name: str) -> bool:
    try:
        opt_class = get_optimizer_info(name).opt_class
    except (ValueError, KeyError):  # wrapped names (lookahead_...) and the like: leave them as they are
        return False
    return "fused" in inspect.signature(opt_class).parameters


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore an optimizer's state but keep this run's implementation flags (a checkpoint from a device
    with fused steps may resume on one without)."""
    flags = [{key: group[key] for key in ("fused", "foreach") if key in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, kept in zip(optimizer.param_groups, flags):
        group.update(kept)


def build_scheduler(
    optimizer: torch.optim.Optimizer, args: argparse.Namespace, updates_per_epoch: int
) -> tuple[Any, int]:
    """timm's scheduler (stepped per epoch, or per update with --sched-on-updates) and the number of
    epochs to train, which is timm's: warmup prefix, cycles and cool-down included."""
    try:
        return create_scheduler_v2(
            optimizer,
            **scheduler_kwargs(args, decreasing_metric=args.eval_metric == "loss"),
            updates_per_epoch=updates_per_epoch,
        )
    except ValueError as err:  # an unknown name, or a schedule that does not fit the epochs
        raise UsageError(f"--sched {args.sched}: {err}") from err


def mean_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate timm's train.py logs: the mean over parameter groups (layer decay scales them)."""
    rates = [group["lr"] for group in optimizer.param_groups]
    return sum(rates) / len(rates)


def build_mixup(args: argparse.Namespace, num_classes: int) -> Mixup | None:
    """Mixup/CutMix on device batches, or None when both are off."""
    if not mixup_requested(args):  # the rule lives with the flags, which check --batch-size by it
        return None
    return Mixup(
        mixup_alpha=args.mixup,
        cutmix_alpha=args.cutmix,
        cutmix_minmax=args.cutmix_minmax,
        prob=args.mixup_prob,
        switch_prob=args.mixup_switch_prob,
        mode=args.mixup_mode,
        label_smoothing=args.smoothing,
        num_classes=num_classes,
    )


def build_train_loss(args: argparse.Namespace, mixup_active: bool) -> torch.nn.Module:
    """timm train.py's choice: under mixup soft-target CE (BCE with --bce-loss); else with --smoothing
    label-smoothing CE (BCE with --bce-loss); else plain CE, --bce-loss or not."""
    bce = {"target_threshold": args.bce_target_thresh, "sum_classes": args.bce_sum, "pos_weight": args.bce_pos_weight}
    if mixup_active:
        return BinaryCrossEntropy(**bce) if args.bce_loss else SoftTargetCrossEntropy()
    if args.smoothing:
        if args.bce_loss:
            return BinaryCrossEntropy(smoothing=args.smoothing, **bce)
        return LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    return torch.nn.CrossEntropyLoss()


def build_train_transform(args: argparse.Namespace, data_config: dict[str, Any]) -> Any:
    """timm's training augmentation ending in uint8 tensors; erasing and normalization happen on the device.
    A zero --color-jitter leaves the jitter out (timm would run a ColorJitter that changes nothing, a
    tenth of a worker's time per image on small images). Auto-augment ops come from vtools' registration
    (:mod:`vtools.data.augment_ops`): the same on every Pillow, and on grayscale images."""
    interpolation = args.train_interpolation
    if args.no_aug or not interpolation:  # as timm's train.py: the model's own interpolation
        interpolation = data_config["interpolation"]
    augment_ops.register()
    return create_transform(
        data_config["input_size"],
        is_training=True,
        use_prefetcher=True,
        no_aug=args.no_aug,
        train_crop_mode=args.train_crop_mode,
        scale=args.scale,
        ratio=args.ratio,
        hflip=args.hflip,
        vflip=args.vflip,
        color_jitter=args.color_jitter or None,
        color_jitter_prob=args.color_jitter_prob,
        grayscale_prob=args.grayscale_prob or 0.0,
        gaussian_blur_prob=args.gaussian_blur_prob or 0.0,
        auto_augment=args.aa,
        interpolation=interpolation,
        mean=data_config["mean"],
        std=data_config["std"],
    )


def build_random_erasing(args: argparse.Namespace, device: torch.device) -> RandomErasing | None:
    if args.reprob <= 0:
        return None
    return RandomErasing(probability=args.reprob, mode=args.remode, max_count=args.recount, device=str(device))


def build_ema(model: torch.nn.Module, args: argparse.Namespace) -> ModelEmaV3 | None:
    if not args.model_ema:
        return None
    return ModelEmaV3(
        model,
        decay=args.model_ema_decay,
        use_warmup=args.model_ema_warmup,
        device=torch.device("cpu") if args.model_ema_force_cpu else None,
    )


def clip_parameters(model: torch.nn.Module, clip_mode: str) -> list[torch.nn.Parameter]:
    """The parameters --clip-grad clips: all of them, except with agc the classifier's weight and bias (the
    model's last two), which timm's train.py leaves unclipped (exclude_head)."""
    parameters = list(model.parameters())
    return parameters[:-2] if "agc" in clip_mode else parameters
