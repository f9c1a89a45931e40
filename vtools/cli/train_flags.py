"""train.py's flags and the checks that need nothing but them, run before torch is imported.

The training code acts on the options (vtools/train/); this module only declares and checks them, with
timm's names, defaults and meanings, so that ``train.py --help`` and a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse

from vtools.cli.config import add_config_flag, parse_with_config
from vtools.cli.declared import add_declared, check_declared
from vtools.cli.eval_flags import add_threshold, check_threshold
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
from vtools.cli.parser import OneLineParser, check_values
from vtools.cli.timm_compat import add_no_op, add_refused
from vtools.cli.tracking_flags import add_mlflow_args, add_wandb_args, check_tracking_args
from vtools.derived_options import mixup_requested
from vtools.errors import UsageError
from vtools.options.train_job import (
    AugmentOptions,
    DataOptions,
    DistillOptions,
    DistributedOptions,
    LoggingOptions,
    ModelOptions,
    OptimOptions,
    RunOptions,
    job_concerns,
)

CONCERNS = (
    DataOptions,
    ModelOptions,
    OptimOptions,
    AugmentOptions,
    RunOptions,
    DistributedOptions,
    LoggingOptions,
    DistillOptions,
)

DESCRIPTION = "train.py's options: timm's train.py flags with timm's names, defaults and meanings."


def build_parser() -> argparse.ArgumentParser:
    """train.py's parser: the flags the scripts share (vtools/cli/options.py), train.py's own generated from
    their declarations (vtools/options/train_job.py), and timm's flags accepted here without effect."""
    parser = OneLineParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(parser)
    may_change_on_resume(parser._option_string_actions["--config"])  # defined for every script in cli/config.py
    group = parser.add_argument_group(DataOptions.title)
    add_data_source_args(group, "DIR", "root holding the train and validation folders (one sub-folder per class)")
    add_dataset_args(group)
    add_on_bad_image(group)
    add_batch_size(group, 128, "per-device batch size (default: 128)")
    add_workers(group)
    add_declared(group, DataOptions)
    add_model_args(parser, default_model="resnet50", checkpoint_flags=False)
    add_declared(parser.add_argument_group("model (training)"), ModelOptions)
    add_preprocess_args(parser)
    for concern in (OptimOptions, AugmentOptions, RunOptions, DistributedOptions, LoggingOptions):
        group = parser.add_argument_group(concern.title)
        add_declared(group, concern)
        if concern is RunOptions:
            add_seed(group)
            may_change_on_resume(add_threshold(group, "precision, recall and F1 in summary.csv and the class report"))
        elif concern is LoggingOptions:
            add_wandb_args(group)
            add_mlflow_args(group, training=True)
    add_device_args(parser, cpu_fallback=True)
    add_distillation_args(parser)
    add_accepted_timm_args(parser)
    return parser


def add_distillation_args(parser: argparse.ArgumentParser) -> None:
    """Knowledge distillation from a teacher, through timm's distillation task; timm's feature and token
    distillation refused."""
    group = parser.add_argument_group(DistillOptions.title)
    add_declared(group, DistillOptions)
    add_refused(
        group, "--kd-distill-type", default="logit", choices=("logit", "feature", "token"), reason=FEATURE_KD_REASON
    )
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
    for flag in ("--train-num-samples", "--val-num-samples"):
        add_no_op(
            group,
            flag,
            type=int,
            default=None,
            reason="timm needs it to size streamed datasets; every vtools source knows its length (shards "
            "streamed from a server: their _info.json, or a |<num_samples> suffix on the split, timm's spelling)",
        )
    add_refused(
        group,
        "--epoch-repeats",
        type=float,
        default=0.0,
        reason="timm repeats only streamed (iterable) datasets; every vtools source is indexed: train more "
        "--epochs instead",
    )
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
        reason="vtools does not write batch images; look at the augmentation with python3 -m benchmarks "
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


# create_model keywords train.py passes from flags of their own: also in --model-kwargs, timm's train.py stops
# ("got multiple values"), and here one of the two would silently win
MODEL_KWARGS_WITH_FLAGS = {
    "num_classes": "--num-classes",
    "in_chans": "--in-chans",
    "global_pool": "--gp",
    "drop_rate": "--drop",
    "drop_path_rate": "--drop-path",
    "drop_block_rate": "--drop-block",
    "bn_momentum": "--bn-momentum",
    "bn_eps": "--bn-eps",
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """train.py's options (defaults < the -c YAML file < flags), with every check that reads only them done."""
    return check(parse_with_config(build_parser(), argv))


def data_source(args: argparse.Namespace) -> str | None:
    """The data train.py reads: --data-dir, with DIR folded into it by :func:`check_train_args`."""
    return args.data_dir


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Every check of train.py's options that reads only them: the command line's and the Python API's
    (vtools/api.py), so the two refuse the same values."""
    check_values(args)
    check_declared(args, *job_concerns())
    check_threshold(args)
    check_train_args(args)
    check_tracking_args(args)
    return args


def check_train_args(args: argparse.Namespace) -> None:
    """train.py's checks that read several options (one option's range: its declaration)."""
    for key, flag in MODEL_KWARGS_WITH_FLAGS.items():
        if key in args.model_kwargs:
            raise UsageError(f"--model-kwargs {key}: train.py sets it with {flag} (timm's train.py fails on both)")
    check_opt_kwargs_values(args.opt_kwargs)
    if mixup_requested(args) and args.batch_size % 2:
        raise UsageError(
            f"--mixup/--cutmix pair up the samples of a batch: --batch-size must be even, got {args.batch_size}"
        )
    # timm's train.py: --data-dir, and DIR only without it (a config's folder is DIR's default: cli/config.py)
    args.data_dir = args.data_dir or args.data  # one spelling in the saved config
    if not args.data_dir and not args.dataset:
        raise UsageError("give the data folder (DIR, --data-dir or data-dir: in the config)")


def check_opt_kwargs_values(opt_kwargs: dict) -> None:
    """An optimizer's keyword arguments are numbers, switches, names or short lists of them (betas): a
    mapping (YAML's ``a: {b: 1}``) reaches the optimizer's constructor and fails there with a traceback."""
    for key, value in opt_kwargs.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        if not all(item is None or isinstance(item, (bool, int, float, str)) for item in items):
            raise UsageError(
                f"--opt-kwargs {key}: takes a number, true/false, a name or a list of numbers, got {value!r}"
            )
