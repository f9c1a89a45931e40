"""train.py's options: timm's train.py flags with timm's names, defaults and meanings."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from vtools.cli.options import (
    WORKERS_HELP,
    add_data_source_args,
    add_dataset_args,
    add_device_args,
    add_model_args,
    add_preprocess_args,
)
from vtools.cli.parser import OneLineParser, check_positive
from vtools.data.decode import ON_BAD_IMAGE
from vtools.errors import UsageError
from vtools.train import recipe


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default="", metavar="FILE", help="YAML file of options (keys = flag names)")
    group = parser.add_argument_group("data")
    add_data_source_args(group, "DIR", "root holding the train and validation folders (one sub-folder per class)")
    add_dataset_args(group)
    group.add_argument(
        "--train-split", default="train", help="training split: folder, split name or shard pattern (default: train)"
    )
    group.add_argument(
        "--val-split",
        default="validation",
        help="validation split; val, eval... folders are found too (default: validation)",
    )
    group.add_argument(
        "--on-bad-image",
        default="error",
        choices=ON_BAD_IMAGE,
        help="stop on an unreadable image, or skip it (default: error)",
    )
    add_model_args(parser, default_model="resnet50", checkpoint_flags=False)
    add_preprocess_args(parser)
    group = parser.add_argument_group("batches")
    group.add_argument("--batch-size", "-b", type=int, default=128, help="per-device batch size (default: 128)")
    group.add_argument("--validation-batch-size", "-vb", type=int, default=None, help="(default: --batch-size)")
    group.add_argument("--grad-accum-steps", type=int, default=1, help="batches per optimizer update")
    group.add_argument("--workers", "-j", type=int, default=None, help=WORKERS_HELP)
    group = parser.add_argument_group("optimizer")
    group.add_argument("--opt", default="sgd", help="timm optimizer name (default: sgd)")
    group.add_argument("--opt-eps", type=float, default=None, help="optimizer epsilon (default: the optimizer's)")
    group.add_argument(
        "--opt-betas", type=float, nargs="+", default=None, help="optimizer betas (default: the optimizer's)"
    )
    group.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    group.add_argument("--weight-decay", type=float, default=2e-5, help="weight decay (default: 2e-5)")
    group.add_argument("--layer-decay", type=float, default=None, help="layer-wise lr decay")
    group.add_argument("--clip-grad", type=float, default=None, help="gradient clipping threshold")
    group.add_argument(
        "--clip-mode", default="norm", choices=("norm", "value", "agc"), help="gradient clipping mode (default: norm)"
    )
    group = parser.add_argument_group("learning rate schedule")
    group.add_argument("--sched", default="cosine", help="timm scheduler (cosine, step, multistep, plateau, ...)")
    group.add_argument("--sched-on-updates", action="store_true", default=False, help="step the schedule per update")
    group.add_argument("--lr", type=float, default=None, help="learning rate (default: scaled from --lr-base)")
    group.add_argument("--lr-base", type=float, default=0.1, help="lr for a global batch of --lr-base-size")
    group.add_argument(
        "--lr-base-size", type=int, default=256, help="global batch size --lr-base is given for (default: 256)"
    )
    group.add_argument(
        "--lr-base-scale",
        default="",
        choices=("", "linear", "sqrt"),
        help="how lr scales with batch size (default: sqrt for adaptive optimizers, else linear)",
    )
    group.add_argument(
        "--warmup-lr", type=float, default=1e-5, help="learning rate at the start of warmup (default: 1e-5)"
    )
    group.add_argument("--min-lr", type=float, default=0.0, help="floor of the schedule (default: 0)")
    group.add_argument("--epochs", type=int, default=300, help="epochs to train (default: 300)")
    group.add_argument("--decay-epochs", type=float, default=90, help="epochs between step decays (default: 90)")
    group.add_argument(
        "--decay-milestones",
        type=int,
        nargs="+",
        default=[90, 180, 270],
        help="epochs at which multistep decays (default: 90 180 270)",
    )
    group.add_argument(
        "--decay-rate", "--dr", type=float, default=0.1, help="lr multiplier at each decay (default: 0.1)"
    )
    group.add_argument("--warmup-epochs", type=int, default=5, help="linear warmup epochs (default: 5)")
    group.add_argument(
        "--warmup-prefix",
        action="store_true",
        default=False,
        help="warmup epochs come before, not within, the schedule",
    )
    group.add_argument(
        "--cooldown-epochs", type=int, default=0, help="epochs at --min-lr after the schedule (default: 0)"
    )
    group.add_argument("--patience-epochs", type=int, default=10, help="plateau schedule patience (default: 10)")
    group.add_argument(
        "--lr-noise",
        type=float,
        nargs="+",
        default=None,
        metavar="FRACTION",
        help="add lr noise from (and until) these fractions of the schedule",
    )
    group.add_argument("--lr-noise-pct", type=float, default=0.67, help="lr noise limit (default: 0.67)")
    group.add_argument("--lr-noise-std", type=float, default=1.0, help="lr noise std-dev (default: 1)")
    group.add_argument(
        "--lr-cycle-mul", type=float, default=1.0, help="cycle length multiplier of cosine/tanh/poly (default: 1)"
    )
    group.add_argument("--lr-cycle-decay", type=float, default=0.5, help="lr multiplier per cycle (default: 0.5)")
    group.add_argument("--lr-cycle-limit", type=int, default=1, help="number of cycles (default: 1)")
    group.add_argument("--lr-k-decay", type=float, default=1.0, help="k-decay of cosine/poly (default: 1)")
    group = parser.add_argument_group("augmentation and regularization")
    group.add_argument("--no-aug", action="store_true", default=False, help="no training augmentation")
    group.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0], help="random resized crop scale")
    group.add_argument("--ratio", type=float, nargs=2, default=[3 / 4, 4 / 3], help="random resized crop ratio")
    group.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability (default: 0.5)")
    group.add_argument("--vflip", type=float, default=0.0, help="vertical flip probability (default: 0)")
    group.add_argument("--color-jitter", type=float, default=0.4, help="color jitter strength (default: 0.4)")
    group.add_argument("--aa", default=None, help="AutoAugment/RandAugment policy, e.g. rand-m9-mstd0.5-inc1")
    group.add_argument(
        "--train-interpolation", default="random", help="training resize interpolation (default: random)"
    )
    group.add_argument("--reprob", type=float, default=0.0, help="random erasing probability (on the device)")
    group.add_argument(
        "--remode", default="pixel", choices=("const", "rand", "pixel"), help="random erasing fill (default: pixel)"
    )
    group.add_argument("--recount", type=int, default=1, help="random erasing count (default: 1)")
    group.add_argument("--mixup", type=float, default=0.0, help="mixup alpha")
    group.add_argument("--cutmix", type=float, default=0.0, help="cutmix alpha")
    group.add_argument(
        "--cutmix-minmax", type=float, nargs=2, default=None, help="cutmix box ratio range (replaces the cutmix alpha)"
    )
    group.add_argument("--mixup-prob", type=float, default=1.0, help="probability of mixing a batch (default: 1)")
    group.add_argument(
        "--mixup-switch-prob",
        type=float,
        default=0.5,
        help="probability of cutmix instead of mixup when both are on (default: 0.5)",
    )
    group.add_argument(
        "--mixup-mode",
        default="batch",
        choices=("batch", "pair", "elem"),
        help="mix per batch, pair or element (default: batch)",
    )
    group.add_argument("--mixup-off-epoch", type=int, default=0, help="turn mixup off from this epoch (0: never)")
    group.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    group.add_argument("--bce-loss", action="store_true", default=False, help="binary cross-entropy loss")
    group.add_argument("--bce-target-thresh", type=float, default=None, help="binarize BCE targets at this threshold")
    group.add_argument("--drop", type=float, default=None, help="dropout rate")
    group.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate")
    group.add_argument("--model-ema", action="store_true", default=False, help="track an EMA of the weights")
    group.add_argument("--model-ema-decay", type=float, default=0.9998, help="EMA decay (default: 0.9998)")
    group.add_argument(
        "--model-ema-warmup", action="store_true", default=False, help="ramp the EMA decay up over the first updates"
    )
    group = parser.add_argument_group("run")
    group.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
    group.add_argument(
        "--log-interval",
        type=int,
        default=50,
        help="batches between loss checks and bar updates; under torchrun also the updates "
        "between the ranks' checks for a stop signal (default: 50)",
    )
    group.add_argument(
        "--val-interval",
        type=int,
        default=1,
        metavar="N",
        help="validate and keep numbered checkpoints every N epochs and after the last (default: 1)",
    )
    group.add_argument("--output", default="runs", metavar="DIR", help="parent folder of run folders")
    group.add_argument("--experiment", default="", help="run folder name (default: <model>-<timestamp>)")
    group.add_argument(
        "--resume",
        default="",
        metavar="PATH",
        help="checkpoint to resume, or auto: the last checkpoint of --experiment, or without "
        "one of the newest <model>-<timestamp> run in --output",
    )
    group.add_argument("--initial-checkpoint", default="", metavar="PATH", help="weights to start from")
    group.add_argument("--checkpoint-hist", type=int, default=10, help="numbered checkpoints to keep")
    group.add_argument(
        "--log-tensorboard",
        action="store_true",
        default=False,
        help="write TensorBoard scalars (per epoch and per log step) to <run>/tensorboard",
    )
    group.add_argument(
        "--eval-metric",
        default="top1",
        choices=("top1", "top5", "loss"),
        help="metric that picks the best checkpoint (default: top1)",
    )
    group.add_argument("--sync-bn", action="store_true", default=False, help="synchronized BatchNorm under DDP")
    group.add_argument("--dist-backend", default=None, help="override the collective backend (default: per device)")
    add_device_args(parser)
    return parser


# rates, probabilities and fractions no recipe can use outside these ranges: (test, what is allowed)
VALUE_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "clip_grad": (lambda v: v > 0, "greater than 0"),
    **dict.fromkeys(
        (
            "lr",
            "lr_base",
            "warmup_lr",
            "min_lr",
            "weight_decay",
            "mixup",
            "cutmix",
            "color_jitter",
            "warmup_epochs",
            "cooldown_epochs",
        ),
        (lambda v: v >= 0, "0 or more"),
    ),
    **dict.fromkeys(("smoothing", "drop", "drop_path"), (lambda v: 0 <= v < 1, "from 0 up to (not including) 1")),
    **dict.fromkeys(
        ("momentum", "reprob", "hflip", "vflip", "mixup_prob", "mixup_switch_prob", "model_ema_decay"),
        (lambda v: 0 <= v <= 1, "from 0 to 1"),
    ),
}


def check_train_args(args: argparse.Namespace) -> None:
    for flag in ("grad_accum_steps", "log_interval", "val_interval"):  # sizes and epochs: check_values
        check_positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    for name, (allowed, text) in VALUE_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not allowed(value):
            raise UsageError(f"--{name.replace('_', '-')} must be {text}, got {value}")
    if recipe.mixup_enabled(args) and args.batch_size % 2:
        raise UsageError(
            f"--mixup/--cutmix pair up the samples of a batch: --batch-size must be even, got {args.batch_size}"
        )
    args.data_dir = args.data or args.data_dir  # one spelling in the saved config
    if not args.data_dir and not args.dataset:
        raise UsageError("give the data folder (DIR, --data-dir or data-dir: in the config)")
