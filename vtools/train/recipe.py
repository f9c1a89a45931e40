"""A training recipe from timm's building blocks: optimizer, scheduler, loss, mixup, EMA, augmentation.

Nothing here is re-implemented: each function maps train.py's options (timm's
flag names) onto the timm factory that owns the job.
"""

from __future__ import annotations

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

from vtools.data import augment_ops
from vtools.derived_options import mixup_requested
from vtools.errors import UsageError
from vtools.options.train_job import AugmentOptions, OptimOptions
from vtools.runtime import device as dev


def scaled_lr(optim: OptimOptions, global_batch_size: int) -> float:
    """--lr, or --lr-base scaled by global batch size / --lr-base-size (sqrt for adaptive optimizers)."""
    if optim.lr is not None:
        return optim.lr
    ratio = global_batch_size / optim.lr_base_size
    scale = optim.lr_base_scale or ("sqrt" if any(name in optim.opt.lower() for name in ("ada", "lamb")) else "linear")
    return optim.lr_base * (ratio**0.5 if scale == "sqrt" else ratio)


def build_optimizer(model: torch.nn.Module, optim: OptimOptions, lr: float) -> torch.optim.Optimizer:
    """timm's optimizer for the flags; its fused step where torch has one for the optimizer and device
    (one pass over the weights instead of one per tensor and operation), unless --opt-kwargs says
    ``fused`` itself (``fused=False``: the per-tensor step, as another device takes it)."""
    check_opt_kwargs_names(optim.opt, optim.opt_kwargs)
    kwargs = {**optimizer_kwargs(optim), **optim.opt_kwargs}
    kwargs["lr"] = lr
    device = next(model.parameters()).device
    kernel = fused_kernel(optim.opt)
    if "fused" not in optim.opt_kwargs and kernel is not None and dev.fused_optimizer(device, kernel):
        kwargs["fused"] = True
    return create_optimizer_v2(model, **kwargs)


def check_opt_kwargs_names(name: str, opt_kwargs: dict[str, Any]) -> None:
    """Refuse an --opt-kwargs name that timm optimizer ``name``'s class does not take, naming those it does:
    its constructor would fail with a bare TypeError. A class taking ``**kwargs``, or a wrapped name
    (lookahead_...), is left to timm."""
    try:
        parameters = inspect.signature(get_optimizer_info(name).opt_class).parameters
    except (ValueError, KeyError, TypeError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    taken = [key for key in parameters if key != "params"]
    unknown = [key for key in opt_kwargs if key not in taken]
    if unknown:
        raise UsageError(f"--opt-kwargs {unknown[0]}: --opt {name} does not take it; it takes {', '.join(taken)}")


def fused_step(optimizer: torch.optim.Optimizer) -> bool | None:
    """Whether the optimizer takes torch's fused step; None for one that has no fused implementation."""
    if "fused" not in optimizer.defaults:
        return None
    return bool(optimizer.defaults["fused"])


def fused_kernel(name: str) -> str | None:
    """The operator of timm optimizer ``name``'s fused step (torch.optim.AdamW: ``_fused_adamw_``); None where its
    class takes no ``fused``."""
    try:
        opt_class = get_optimizer_info(name).opt_class
    except (ValueError, KeyError):  # wrapped names (lookahead_...) and the like: leave them as they are
        return None
    if "fused" not in inspect.signature(opt_class).parameters:
        return None
    return f"_fused_{opt_class.__name__.lower()}_"


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore an optimizer's state but keep this run's implementation flags (a checkpoint from a device
    with fused steps may resume on one without)."""
    flags = [{key: group[key] for key in ("fused", "foreach") if key in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, kept in zip(optimizer.param_groups, flags):
        group.update(kept)


def build_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimOptions, updates_per_epoch: int, eval_metric: str, seed: int
) -> tuple[Any, int]:
    """timm's scheduler (stepped per epoch, or per update with --sched-on-updates) and the number of
    epochs to train, which is timm's: warmup prefix, cycles and cool-down included. A plateau schedule
    follows ``eval_metric``; --lr-noise draws from ``seed``, as timm's does from --seed."""
    kwargs = scheduler_kwargs(optim, decreasing_metric=eval_metric == "loss")
    kwargs["noise_seed"] = seed
    try:
        return create_scheduler_v2(optimizer, **kwargs, updates_per_epoch=updates_per_epoch)
    except ValueError as err:  # an unknown name, or a schedule that does not fit the epochs
        raise UsageError(f"--sched {optim.sched}: {err}") from err


def mean_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate timm's train.py logs: the mean over parameter groups (layer decay scales them)."""
    rates = [group["lr"] for group in optimizer.param_groups]
    return sum(rates) / len(rates)


def build_mixup(augment: AugmentOptions, num_classes: int, multi_label: bool = False) -> Mixup | None:
    """Mixup/CutMix on device batches, or None when both are off; ``multi_label``: timm's mixing of
    multi-hot targets (each label smoothed towards 0.5)."""
    if not mixup_requested(augment):  # the rule lives with the flags, which check --batch-size by it
        return None
    return Mixup(
        mixup_alpha=augment.mixup,
        cutmix_alpha=augment.cutmix,
        cutmix_minmax=augment.cutmix_minmax,
        prob=augment.mixup_prob,
        switch_prob=augment.mixup_switch_prob,
        mode=augment.mixup_mode,
        label_smoothing=augment.smoothing,
        num_classes=num_classes,
        multi_label=multi_label,
    )


def build_train_loss(
    augment: AugmentOptions,
    mixup_active: bool,
    class_weights: torch.Tensor | None = None,
    multi_label: bool = False,
) -> torch.nn.Module:
    """timm train.py's choice: under mixup soft-target CE (BCE with --bce-loss); else with --smoothing
    label-smoothing CE (BCE with --bce-loss); else plain CE, --bce-loss or not. ``class_weights``
    (--class-weights) weight each class's term: timm's BCE takes them as its ``weight``; cross-entropy
    becomes torch's weighted one (its label smoothing, soft targets under mixup). ``multi_label``
    (multi-hot targets): timm's BCE always, --smoothing moving each label towards 0.5 (done by timm's
    mixup when it is on)."""
    bce = {
        "target_threshold": augment.bce_target_thresh,
        "sum_classes": augment.bce_sum,
        "pos_weight": augment.bce_pos_weight,
        "weight": class_weights,
    }
    if multi_label:
        smoothing = 0.0 if mixup_active else augment.smoothing
        return BinaryCrossEntropy(smoothing=smoothing, smooth_dense=True, **bce)
    if mixup_active:
        if augment.bce_loss:
            return BinaryCrossEntropy(**bce)
        return SoftTargetCrossEntropy() if class_weights is None else WeightedCrossEntropy(class_weights, 0.0)
    if augment.smoothing and augment.bce_loss:
        return BinaryCrossEntropy(smoothing=augment.smoothing, **bce)
    if class_weights is not None:
        return WeightedCrossEntropy(class_weights, augment.smoothing)
    if augment.smoothing:
        return LabelSmoothingCrossEntropy(smoothing=augment.smoothing)
    return torch.nn.CrossEntropyLoss()


class WeightedCrossEntropy(torch.nn.Module):
    """torch's class-weighted cross-entropy on class indices (with label smoothing) or soft targets; the
    weights live as a buffer so they follow the loss to the device, in the logits' dtype.

    On class indices torch's mean divides by the batch's summed target weights, which is 0 for a batch whose
    classes all weigh 0 (a weights file may give 0): 0/0, and the run would stop as diverged. Such a batch
    teaches nothing, so its loss is 0 with a zero gradient, decided on the device (no host sync)."""

    def __init__(self, weight: torch.Tensor, smoothing: float) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.smoothing = smoothing

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        weight = self.weight.to(logits.dtype)
        if target.is_floating_point():  # soft targets: torch averages over the batch, not over weights
            return torch.nn.functional.cross_entropy(logits, target, weight=weight, label_smoothing=self.smoothing)
        total = torch.nn.functional.cross_entropy(
            logits, target, weight=weight, label_smoothing=self.smoothing, reduction="sum"
        )
        batch_weight = weight[target].sum()
        weighs = batch_weight > 0
        return torch.where(weighs, total / torch.where(weighs, batch_weight, torch.ones_like(batch_weight)), total * 0)


def build_train_transform(augment: AugmentOptions, data_config: dict[str, Any]) -> Any:
    """timm's training augmentation ending in uint8 tensors; erasing and normalization happen on the device.
    A zero --color-jitter leaves the jitter out (timm would run a ColorJitter that changes nothing, a
    tenth of a worker's time per image on small images). Auto-augment ops come from vtools' registration
    (:mod:`vtools.data.augment_ops`): the same on every Pillow, and on grayscale images."""
    interpolation = augment.train_interpolation
    if augment.no_aug or not interpolation:  # as timm's train.py: the model's own interpolation
        interpolation = data_config["interpolation"]
    augment_ops.register()
    return create_transform(
        data_config["input_size"],
        is_training=True,
        use_prefetcher=True,
        no_aug=augment.no_aug,
        train_crop_mode=augment.train_crop_mode,
        scale=augment.scale,
        ratio=augment.ratio,
        hflip=augment.hflip,
        vflip=augment.vflip,
        color_jitter=augment.color_jitter or None,
        color_jitter_prob=augment.color_jitter_prob,
        grayscale_prob=augment.grayscale_prob or 0.0,
        gaussian_blur_prob=augment.gaussian_blur_prob or 0.0,
        auto_augment=augment.aa,
        interpolation=interpolation,
        mean=data_config["mean"],
        std=data_config["std"],
    )


def build_random_erasing(augment: AugmentOptions, device: torch.device) -> RandomErasing | None:
    if augment.reprob <= 0:
        return None
    return RandomErasing(probability=augment.reprob, mode=augment.remode, max_count=augment.recount, device=str(device))


def build_ema(model: torch.nn.Module, optim: OptimOptions) -> ModelEmaV3 | None:
    if not optim.model_ema:
        return None
    return ModelEmaV3(
        model,
        decay=optim.model_ema_decay,
        use_warmup=optim.model_ema_warmup,
        device=torch.device("cpu") if optim.model_ema_force_cpu else None,
    )


def clip_parameters(model: torch.nn.Module, clip_mode: str) -> list[torch.nn.Parameter]:
    """The parameters --clip-grad clips: all of them, except with agc the classifier's weight and bias (the
    model's last two), which timm's train.py leaves unclipped (exclude_head)."""
    parameters = list(model.parameters())
    return parameters[:-2] if "agc" in clip_mode else parameters
