"""train.py's flags and the checks that need nothing but them, run before torch is imported.

The training code acts on the options (vtools/train/); this module only declares and checks them, with
timm's names, defaults and meanings, so that ``train.py --help`` and a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from vtools.cli.config import add_config_flag, parse_with_config
from vtools.cli.eval_flags import add_threshold
from vtools.cli.flag_values import KeyValuePairs, collective_seconds, recovery_interval
from vtools.cli.options import (
    add_batch_size,
    add_data_source_args,
    add_dataset_args,
    add_device_args,
    add_loader_no_ops,
    add_model_args,
    add_naflex_refusals,
    add_on_bad_image,
    add_preprocess_args,
    add_seed,
    add_workers,
    may_change_on_resume,
)
from vtools.cli.parser import OneLineParser, check_positive, check_values
from vtools.cli.timm_compat import add_no_op, add_refused
from vtools.cli.tracking_flags import add_mlflow_args, add_wandb_args, check_tracking_args
from vtools.derived_options import mixup_requested
from vtools.errors import UsageError

DESCRIPTION = "train.py's options: timm's train.py flags with timm's names, defaults and meanings."


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(parser)
    may_change_on_resume(parser._option_string_actions["--config"])  # defined for every script in cli/config.py
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
    add_on_bad_image(group)
    group.add_argument(
        "--wds-shuffle-size",
        type=int,
        default=8192,
        metavar="N",
        help="wds/ shards streamed from a server (an http(s):// URL or pipe: command as --data-dir or split): "
        "samples each loader worker holds to shuffle the stream, as timm's WDS_SHUFFLE_SIZE (default: 8192; "
        "1: the shards' own order); memory: N encoded images per worker; part of the run: a resume needs "
        "the same N to skip exactly the samples it trained (docs/data.md#shards-from-a-server)",
    )
    for flag in ("--train-num-samples", "--val-num-samples"):
        add_no_op(
            group,
            flag,
            type=int,
            default=None,
            reason="timm needs it to size streamed datasets; every vtools source knows its length (shards "
            "streamed from a server: their _info.json, or a |<num_samples> suffix on the split, timm's spelling)",
        )
    add_model_args(parser, default_model="resnet50", checkpoint_flags=False)
    add_train_model_args(parser)
    add_preprocess_args(parser)
    group = parser.add_argument_group("batches")
    add_batch_size(group, 128, "per-device batch size (default: 128)")
    may_change_on_resume(
        group.add_argument("--validation-batch-size", "-vb", type=int, default=None, help="(default: --batch-size)")
    )
    group.add_argument("--grad-accum-steps", type=int, default=1, help="batches per optimizer update")
    group.add_argument(
        "--balanced-sampler",
        action="store_true",
        default=False,
        help="draw each epoch's training images by inverse class frequency (with replacement), so every class "
        "comes equally often; seeded, sharded across processes, resumable mid-epoch",
    )
    add_workers(group)
    group = parser.add_argument_group("optimizer")
    group.add_argument("--opt", default="sgd", help="timm optimizer name (default: sgd)")
    group.add_argument("--opt-eps", type=float, default=None, help="optimizer epsilon (default: the optimizer's)")
    group.add_argument(
        "--opt-betas", type=float, nargs="+", default=None, help="optimizer betas (default: the optimizer's)"
    )
    group.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    group.add_argument("--weight-decay", type=float, default=2e-5, help="weight decay (default: 2e-5)")
    group.add_argument("--layer-decay", type=float, default=None, help="layer-wise lr decay")
    group.add_argument(
        "--layer-decay-min-scale", type=float, default=0, help="floor of the layer-decay lr scale (default: 0)"
    )
    group.add_argument(
        "--layer-decay-no-opt-scale",
        type=float,
        default=None,
        help="layers whose layer-decay scale falls below this are frozen",
    )
    group.add_argument(
        "--opt-kwargs",
        nargs="*",
        default={},
        action=KeyValuePairs,
        metavar="KEY=VALUE",
        help="extra keyword arguments for the optimizer",
    )
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
    may_change_on_resume(group.add_argument("--epochs", type=int, default=300, help="epochs to train (default: 300)"))
    add_refused(
        group,
        "--epoch-repeats",
        type=float,
        default=0.0,
        reason="timm repeats only streamed (iterable) datasets; every vtools source is indexed: train more "
        "--epochs instead",
    )
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
    group.add_argument(
        "--train-crop-mode", default=None, metavar="MODE", help="training crop: rrc (default) or rkrc, rkrr"
    )
    group.add_argument("--scale", type=float, nargs="+", default=[0.08, 1.0], help="random resized crop scale")
    group.add_argument("--ratio", type=float, nargs="+", default=[3 / 4, 4 / 3], help="random resized crop ratio")
    group.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability (default: 0.5)")
    group.add_argument("--vflip", type=float, default=0.0, help="vertical flip probability (default: 0)")
    group.add_argument("--color-jitter", type=float, default=0.4, help="color jitter strength (default: 0.4)")
    group.add_argument(
        "--color-jitter-prob", type=float, default=None, help="probability of color jitter (default: always)"
    )
    group.add_argument("--grayscale-prob", type=float, default=None, help="probability of grayscale conversion")
    group.add_argument("--gaussian-blur-prob", type=float, default=None, help="probability of gaussian blur")
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
        "--cutmix-minmax",
        type=float,
        nargs="+",
        default=None,
        help="cutmix box ratio range (replaces the cutmix alpha)",
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
    group.add_argument(
        "--bce-loss",
        action="store_true",
        default=False,
        help="binary cross-entropy loss (with --smoothing or mixup; plain cross-entropy otherwise, as timm)",
    )
    group.add_argument("--bce-sum", action="store_true", default=False, help="sum the BCE loss over classes")
    group.add_argument("--bce-target-thresh", type=float, default=None, help="binarize BCE targets at this threshold")
    group.add_argument("--bce-pos-weight", type=float, default=None, help="BCE weight of positive targets")
    group.add_argument(
        "--class-weights",
        default="",
        metavar="balanced|FILE",
        help="weight each class's loss term: 'balanced' by inverse class frequency (scikit-learn's formula), or "
        "a file of weights (JSON object or list, or CSV class,weight rows); for imbalanced classes (default: off)",
    )
    group.add_argument(
        "--aug-repeats",
        type=float,
        default=0,
        metavar="N",
        help="repeated augmentation: each image N times per epoch, spread over the processes (timm's "
        "RepeatAugSampler; DeiT recipes use 3) (default: 0, off)",
    )
    group.add_argument("--drop", type=float, default=0.0, help="dropout rate (default: 0)")
    group.add_argument(
        "--drop-connect", type=float, default=None, help="old name of --drop-path (used when --drop-path is not)"
    )
    group.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate")
    group.add_argument("--drop-block", type=float, default=None, help="DropBlock rate")
    group.add_argument("--model-ema", action="store_true", default=False, help="track an EMA of the weights")
    group.add_argument("--model-ema-decay", type=float, default=0.9998, help="EMA decay (default: 0.9998)")
    group.add_argument(
        "--model-ema-warmup", action="store_true", default=False, help="ramp the EMA decay up over the first updates"
    )
    group.add_argument(
        "--model-ema-force-cpu",
        action="store_true",
        default=False,
        help="keep the EMA weights on the host (as timm, the EMA is then not validated: the best checkpoint "
        "follows the trained weights)",
    )
    group = parser.add_argument_group("run")
    add_seed(group)
    may_change_on_resume(
        group.add_argument(
            "--log-interval",
            type=int,
            default=50,
            help="batches between loss checks and bar updates; under torchrun also the updates "
            "between the ranks' checks for a stop signal (default: 50)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--val-interval",
            type=int,
            default=1,
            metavar="N",
            help="validate and keep numbered checkpoints every N epochs and after the last (default: 1)",
        )
    )
    may_change_on_resume(
        group.add_argument("--output", default="", metavar="DIR", help="parent folder of run folders (default: runs)")
    )
    may_change_on_resume(
        group.add_argument("--experiment", default="", help="run folder name (default: <model>-<timestamp>)")
    )
    may_change_on_resume(
        group.add_argument(
            "--resume",
            default="",
            metavar="PATH",
            help="checkpoint to resume, or auto: the last checkpoint of --experiment, or without "
            "one of the newest <model>-<timestamp> run in --output",
        )
    )
    may_change_on_resume(
        group.add_argument("--initial-checkpoint", default="", metavar="PATH", help="weights to start from")
    )
    may_change_on_resume(
        group.add_argument(
            "--no-resume-opt",
            action="store_true",
            default=False,
            help="with --resume: restart the optimizer and GradScaler state, keep weights and position",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--start-epoch",
            type=int,
            default=None,
            metavar="N",
            help="epoch to start at (the schedule starts there too); overrides a resumed position",
        )
    )
    may_change_on_resume(
        group.add_argument("--checkpoint-hist", type=int, default=10, help="numbered checkpoints to keep")
    )
    may_change_on_resume(
        group.add_argument(
            "--recovery-interval",
            type=recovery_interval,
            default=0,
            metavar="N|TIME",
            help="also save a recovery checkpoint every N updates, or every TIME of training (900s, 30m, 2h), "
            "written in the background; --resume auto continues from the newest checkpoint (default: 0, off)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--recovery-keep", type=int, default=2, metavar="K", help="recovery checkpoints to keep (default: 2)"
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--log-tensorboard",
            action="store_true",
            default=False,
            help="write TensorBoard scalars (per epoch and per log step) to <run>/tensorboard",
        )
    )
    add_wandb_args(group)
    add_mlflow_args(group, training=True)
    group.add_argument(
        "--eval-metric",
        default="top1",
        choices=("top1", "top5", "loss", "map"),
        help="metric that picks the best checkpoint; map (mean average precision) for multi-label data, which "
        "takes it whatever is given (default: top1)",
    )
    may_change_on_resume(add_threshold(group, "precision, recall and F1 in summary.csv and the class report"))
    may_change_on_resume(  # a resume may extend the patience: the wait is read back from summary.csv
        group.add_argument(
            "--early-stop-patience",
            type=int,
            default=0,
            metavar="N",
            help="stop the run once --eval-metric has not improved for N validations in a row (epochs that "
            "--val-interval skips do not count); the best model folder is still exported (default: 0, off)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--early-stop-min-delta",
            type=float,
            default=0.0,
            metavar="D",
            help="an improvement for --early-stop-patience must beat the best by more than D (default: 0.0)",
        )
    )
    group.add_argument("--sync-bn", action="store_true", default=False, help="synchronized BatchNorm under DDP")
    group.add_argument(
        "--dist-bn",
        default="reduce",
        choices=("reduce", "broadcast", ""),
        help="after each epoch under DDP, average (reduce) BatchNorm statistics over the processes, or copy "
        "rank 0's (broadcast), or leave each rank's ('') (default: reduce)",
    )
    group.add_argument(
        "--no-ddp-bb", action="store_true", default=False, help="DDP does not broadcast buffers before each forward"
    )
    may_change_on_resume(
        group.add_argument(
            "--synchronize-step",
            action="store_true",
            default=False,
            help="wait for the device after every update (timing and debugging; slower)",
        )
    )
    may_change_on_resume(
        group.add_argument("--dist-backend", default=None, help="override the collective backend (default: per device)")
    )
    may_change_on_resume(
        group.add_argument(
            "--dist-timeout",
            type=collective_seconds,
            default=1800.0,
            metavar="SECONDS",
            help="under torchrun: how long a collective, or a rank's silence, may last before the job ends "
            "naming the rank that stopped (default: 1800, torch's own)",
        )
    )
    add_device_args(parser, cpu_fallback=True)
    add_distillation_args(parser)
    add_accepted_timm_args(parser)
    return parser


def add_train_model_args(parser: argparse.ArgumentParser) -> None:
    """Model flags of timm's train.py beyond the ones every script shares."""
    group = parser.add_argument_group("model (training)")
    may_change_on_resume(
        group.add_argument(
            "--pretrained-path",
            default=None,
            metavar="PATH",
            help="pretrained weights file for --model (its classifier is adapted to --num-classes)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--grad-checkpointing",
            action="store_true",
            default=False,
            help="recompute activations in the backward pass (less memory, about a third more compute)",
        )
    )
    group.add_argument("--head-init-scale", type=float, default=None, help="scale the classifier's initial weights")
    group.add_argument("--head-init-bias", type=float, default=None, help="initial value of the classifier's bias")
    group.add_argument("--bn-momentum", type=float, default=None, help="BatchNorm momentum (default: the model's)")
    group.add_argument("--bn-eps", type=float, default=None, help="BatchNorm epsilon (default: the model's)")


def add_distillation_args(parser: argparse.ArgumentParser) -> None:
    """Knowledge distillation from a teacher, through timm's distillation task."""
    group = parser.add_argument_group("knowledge distillation (timm.task)")
    group.add_argument(
        "--kd-model-name",
        default=None,
        metavar="NAME",
        help="teacher model (pretrained): a timm name, hf-hub:..., or a model folder; it is rebuilt, "
        "not saved, on resume",
    )
    add_refused(
        group, "--kd-distill-type", default="logit", choices=("logit", "feature", "token"), reason=FEATURE_KD_REASON
    )
    group.add_argument("--kd-loss-type", default="kl", choices=("kl",), help="distillation loss (default: kl)")
    group.add_argument(
        "--distill-loss-weight",
        type=float,
        default=None,
        help="weight of the distillation loss (default: 1, or 1 - --task-loss-weight when only that is given)",
    )
    group.add_argument("--task-loss-weight", type=float, default=None, help="weight of the task loss (default: 1)")
    group.add_argument("--kd-temperature", type=float, default=4.0, help="softmax temperature (default: 4)")
    for flag in ("--kd-student-feature-dim", "--kd-teacher-feature-dim"):
        add_refused(group, flag, type=int, default=None, reason=FEATURE_KD_REASON)
    add_refused(group, "--kd-token-distill-type", default="soft", choices=("soft", "hard"), reason=FEATURE_KD_REASON)


FEATURE_KD_REASON = (
    "feature and token distillation train a projection or token that vtools' checkpoints and model "
    "folders do not hold yet; use --kd-distill-type logit"
)
VARIABLE_SIZE_REASON = (
    "variable-resolution and NaFlex batches need timm's scheduled/NaFlex loaders, which vtools' exact-resume "
    "sampler does not drive yet; train at one --input-size (use timm's train.py for these recipes)"
)
LOADER_NO_OP_REASON = (
    "vtools always pins host batches where the device benefits, normalizes on the device, "
    "and keeps its loader workers across epochs"
)
AUGMIX_SPLIT_REASON = (
    "AugMix split batches (--aug-splits, --jsd-loss, --split-bn, --resplit) are not supported by vtools' "
    "device-side batch pipeline yet; use --aa augmix-m9 with the default loss"
)


def add_accepted_timm_args(parser: argparse.ArgumentParser) -> None:
    """timm train.py flags accepted for compatibility: no-ops here, or refused unless at timm's default."""
    group = parser.add_argument_group("timm compatibility (see the README's table)")
    add_loader_no_ops(group, pin_mem_reason=LOADER_NO_OP_REASON, no_prefetcher_reason=LOADER_NO_OP_REASON)
    may_change_on_resume(
        add_no_op(group, "--use-multi-epochs-loader", action="store_true", default=False, reason=LOADER_NO_OP_REASON)
    )
    may_change_on_resume(
        add_no_op(
            group,
            "--local_rank",
            type=int,
            default=0,
            reason="the legacy torch.distributed.launch argument; the local rank comes from LOCAL_RANK",
        )
    )
    add_refused(
        group,
        "--worker-seeding",
        default="all",
        reason="vtools seeds every sample from (seed, epoch, index), which keeps resume exact; timm's 'all' "
        "is the only mode that matches that",
    )
    add_refused(
        group,
        "--tta",
        type=int,
        default=0,
        reason="timm's train.py test-time augmentation needs a TTA loader that it does not build either",
    )
    add_refused(
        group,
        "--save-images",
        action="store_true",
        default=False,
        reason="vtools does not write batch images; look at the augmentation with python -m vtools bench "
        "--profile, or with timm's transforms directly",
    )
    for flag, spec in {
        "--aug-splits": {"type": int, "default": 0},
        "--jsd-loss": {"action": "store_true", "default": False},
        "--split-bn": {"action": "store_true", "default": False},
        "--resplit": {"action": "store_true", "default": False},
    }.items():
        add_refused(group, flag, reason=AUGMIX_SPLIT_REASON, **spec)
    for flags, spec in (
        (("--train-img-sizes",), {"type": int, "nargs": "+", "default": None}),
        (("--train-batch-sizes",), {"type": int, "nargs": "+", "default": None}),
        (("--train-size-probs",), {"type": float, "nargs": "+", "default": None}),
        (("--train-size-schedule",), {"default": "constant", "choices": ("constant", "progressive")}),
        (("--train-size-schedule-spread",), {"type": float, "default": 0.65}),
        (("--train-size-random-mix",), {"type": float, "default": 0.1}),
        (("--train-batches-per-epoch", "--train-steps-per-epoch"), {"type": int, "default": None}),
        (("--variable-batch-loss-scale",), {"default": "none", "choices": ("none", "sqrt", "linear")}),
    ):
        add_refused(group, *flags, reason=VARIABLE_SIZE_REASON, **spec)
    add_naflex_refusals(group, VARIABLE_SIZE_REASON, training=True)


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
            "early_stop_patience",
            "early_stop_min_delta",
        ),
        (lambda v: v >= 0, "0 or more"),
    ),
    **dict.fromkeys(
        ("smoothing", "drop", "drop_path", "drop_connect", "drop_block"),
        (lambda v: 0 <= v < 1, "from 0 up to (not including) 1"),
    ),
    "aug_repeats": (lambda v: v == 0 or v >= 1, "0 (off) or at least 1"),
    "kd_temperature": (lambda v: v > 0, "greater than 0"),
    **dict.fromkeys(
        (
            "momentum",
            "reprob",
            "hflip",
            "vflip",
            "mixup_prob",
            "mixup_switch_prob",
            "model_ema_decay",
            "color_jitter_prob",
            "grayscale_prob",
            "gaussian_blur_prob",
            "threshold",
        ),
        (lambda v: 0 <= v <= 1, "from 0 to 1"),
    ),
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """train.py's options (defaults < the -c YAML file < flags), with every check that reads only them done."""
    return check(parse_with_config(build_parser(), argv))


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Every check of train.py's options that reads only them: the command line's and the Python API's
    (vtools/api.py), so the two refuse the same values."""
    check_values(args)
    check_train_args(args)
    check_tracking_args(args)
    return args


def check_train_args(args: argparse.Namespace) -> None:
    """train.py's own value checks (the ones every script shares: vtools.cli.parser.check_values)."""
    for flag in (
        "grad_accum_steps",
        "log_interval",
        "val_interval",
        "recovery_keep",
        "wds_shuffle_size",
    ):  # sizes and epochs: check_values
        check_positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    for name, (allowed, text) in VALUE_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not allowed(value):
            raise UsageError(f"--{name.replace('_', '-')} must be {text}, got {value}")
    for name in ("scale", "ratio", "cutmix_minmax"):  # timm parses one or more; its transforms need two
        pair = getattr(args, name)
        if pair is not None and (len(pair) != 2 or pair[0] > pair[1]):
            raise UsageError(
                f"--{name.replace('_', '-')} takes two values, low and high, got {' '.join(map(str, pair))}"
            )
    if mixup_requested(args) and args.batch_size % 2:
        raise UsageError(
            f"--mixup/--cutmix pair up the samples of a batch: --batch-size must be even, got {args.batch_size}"
        )
    # timm's train.py: --data-dir, and DIR only without it (a config's folder is DIR's default: cli/config.py)
    args.data_dir = args.data_dir or args.data  # one spelling in the saved config
    if not args.data_dir and not args.dataset:
        raise UsageError("give the data folder (DIR, --data-dir or data-dir: in the config)")
