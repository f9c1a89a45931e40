"""train.py's flags and the checks that need nothing but them, run before torch is imported.

The training code acts on the options (vtools/train/); this module composes train.py's parser from the
declarations (vtools/options/) and checks what several options say together, so that ``train.py --help``
and a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse

from vtools.cli.config import add_config_flag, parse_with_config
from vtools.cli.declared import add_declared
from vtools.cli.eval_flags import add_threshold
from vtools.cli.options import (
    add_data_source_args,
    add_dataset_args,
    add_device_args,
    add_loader_no_ops,
    add_loading,
    add_model_args,
    add_naflex_refusals,
    add_preprocess_args,
    add_seed,
)
from vtools.cli.parser import OneLineParser, check_values
from vtools.cli.tracking_flags import add_mlflow_args, add_tensorboard_arg, add_wandb_args, check_tracking_args
from vtools.cli.typed import typed_options
from vtools.derived_options import mixup_requested
from vtools.errors import UsageError
from vtools.options.shared import LOADER_NO_OP_REASON
from vtools.options.train_compat import VARIABLE_SIZE_REASON, FeatureDistillFlags, TimmTrainFlags
from vtools.options.train_job import (
    AugmentOptions,
    DataOptions,
    DistillOptions,
    DistributedOptions,
    LoggingOptions,
    ModelOptions,
    OptimOptions,
    RunOptions,
    TrainJob,
)

DESCRIPTION = "train.py's options: timm's train.py flags with timm's names, defaults and meanings."


def build_parser() -> argparse.ArgumentParser:
    """train.py's parser, generated from the declarations: the flags the scripts share
    (vtools/options/shared.py), train.py's own (vtools/options/train_job.py), and timm's flags accepted here
    without effect (vtools/options/train_compat.py)."""
    parser = OneLineParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(parser)
    group = parser.add_argument_group(DataOptions.title)
    add_data_source_args(group, "DIR", "root holding the train and validation folders (one sub-folder per class)")
    add_dataset_args(group)
    add_loading(group, 128, "per-device batch size (default: 128)")
    add_declared(group, DataOptions)
    add_model_args(parser, default_model="resnet50", checkpoint_flags=False)
    add_declared(parser.add_argument_group("model (training)"), ModelOptions)
    add_preprocess_args(parser)
    for concern in (OptimOptions, AugmentOptions, RunOptions, DistributedOptions, LoggingOptions):
        group = parser.add_argument_group(concern.title)
        add_declared(group, concern)
        if concern is RunOptions:
            add_seed(group)
            add_threshold(group, "precision, recall and F1 in summary.csv and the class report")
        elif concern is LoggingOptions:
            add_tensorboard_arg(group)
            add_wandb_args(group)
            add_mlflow_args(group, training=True)
    add_device_args(parser, cpu_fallback=True)
    group = parser.add_argument_group(DistillOptions.title)
    add_declared(group, DistillOptions)
    add_declared(group, FeatureDistillFlags)
    group = parser.add_argument_group(TimmTrainFlags.title)
    add_declared(group, TimmTrainFlags)
    add_loader_no_ops(group, pin_mem_reason=LOADER_NO_OP_REASON, no_prefetcher_reason=LOADER_NO_OP_REASON)
    add_naflex_refusals(group, VARIABLE_SIZE_REASON, training=True)
    return parser


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


def typed(parsed: argparse.Namespace) -> TrainJob:
    """train.py's options as the typed job the training code takes (vtools/cli/typed.py)."""
    return typed_options(TrainJob, parsed)


def data_source(args: argparse.Namespace) -> str | None:
    """The data train.py reads: --data-dir, with DIR folded into it by :func:`check_train_args`."""
    return args.data_dir


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Every check of train.py's options that reads several of them (one option's range: its declaration,
    checked as the parser reads it): the command line's and the Python API's (vtools/api.py), so the two
    refuse the same values."""
    check_values(args)
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
