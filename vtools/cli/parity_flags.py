"""``python -m vtools parity``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them). ``--train`` hands every flag
but parity's own to train.py's parser."""

from __future__ import annotations

import argparse

from vtools.cli import train_flags
from vtools.cli.declared import add_declared
from vtools.cli.options import add_device_args, add_model_args, add_preprocess_args
from vtools.cli.parser import OneLineParser, check_ranges
from vtools.cli.typed import generated_options, typed_options
from vtools.options.declare import ParsedOptions
from vtools.options.shared import LoadingFlags, ResultFlags
from vtools.options.tools import DEFAULT_TOLERANCES, ParityFlags
from vtools.options.train_job import OptimOptions, TrainJob

DESCRIPTION = """\
``python -m vtools parity MODEL --device npu --against cpu``: does a device compute what another does?

The same weights (a timm name at random init, or --pretrained; a model folder; --checkpoint) and the
same batch (images from --data through the model's eval preprocessing, else a seeded random batch) run
--steps SGD training steps on both devices: forward, loss, backward, update. Every leaf module's
output, the loss, every parameter's gradient and updated value are compared, and the first one out of
tolerance, in the order the run produced them, is named:

    parity: FAIL at layer1.0.conv1 (Conv2d): max rel err 0.01 > tol 0.0001 (activation; ...)

exit 3; ``parity: pass (...)`` exits 0. The error of a tensor is max|a - b| / (max|b| + 1e-12), b the
reference's (vtools/observe/parity.py). --amp runs the device under its AMP policy against fp32 on the
reference, with tolerances for the dtype; --tol and --grad-tol override. Both sides run contiguous tensors;
--channels-last puts the device side in channels_last. --results-file writes the per-layer table.

``python -m vtools parity --train -c RUN.yaml [train.py's flags] --device npu --against cpu --steps N``
compares train.py's own step instead (vtools/train/parity_recipe.py): each side builds the run as
train.py does (data and loader, model, timm's optimizer, loss, mixup, EMA, clipping) from the same weights
and runs N batches through train.py's loop; the update is judged by the change it made to each weight.
Every other flag is train.py's.
"""
TRAIN_FLAG = "--train"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m vtools parity", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_declared(parser, ParityFlags, only=("model_name",))
    group = add_comparison_args(parser)
    add_declared(group, ParityFlags, only=("train", "data"))
    changes = {
        "batch_size": {"default": 8, "help": "batch size (default: 8)"},
        "seed": {"help": "seed of weights, batch and targets"},
        "lr": {"default": 0.01, "help": "SGD learning rate of the steps (default: 0.01)"},
    }
    add_declared(group, LoadingFlags, only=("batch_size",), changes=changes)
    add_declared(group, OptimOptions, only=("lr",), changes=changes)
    add_declared(group, LoadingFlags, only=("seed",), changes=changes)
    add_model_args(parser)
    add_preprocess_args(parser)
    add_device_args(parser)
    return parser


def add_comparison_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags both modes share (the reference, the steps, tolerances, the table); the group, for more."""
    group = parser.add_argument_group(ParityFlags.title)
    changes = {
        "tol": {"help": _tolerance_help("each activation and the loss", 0)},
        "grad_tol": {"help": _tolerance_help("each gradient and updated weight", 1)},
    }
    add_declared(group, ParityFlags, only=("against", "steps", "tol", "grad_tol"), changes=changes)
    changes = {"results_file": {"help": "write the per-layer table here"}}
    add_declared(group, ResultFlags, only=("results_file", "results_format"), changes=changes)
    return group


def _tolerance_help(what: str, column: int) -> str:
    defaults = ", ".join(f"{name} {values[column]:g}" for name, values in DEFAULT_TOLERANCES.items())
    return f"allowed max relative error of {what} (default: by the device's compute dtype: {defaults})"


def build_train_parser() -> argparse.ArgumentParser:
    """--train's own flags, taken out of the command line before train.py's parser reads the rest."""
    parser = OneLineParser(prog="python -m vtools parity --train", add_help=False, allow_abbrev=False)
    add_comparison_args(parser)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """parity's options; with ``--train``, parity's own flags and, as ``train_args``, train.py's parse of the
    rest (its -c RUN.yaml, checks included). ``train_args`` is None when a MODEL is compared."""
    argv = list(argv or [])
    if TRAIN_FLAG in argv and not {"-h", "--help"} & set(argv):
        parser = build_train_parser()
        own, rest = parser.parse_known_args([arg for arg in argv if arg != TRAIN_FLAG])
        check_ranges(parser, own)  # a known-args parse: the ranges OneLineParser.parse_args would check
        own.train_args = train_flags.parse(rest)
        return own
    args = build_parser().parse_args(argv)
    args.train_args = None
    return args


def typed(parsed: argparse.Namespace) -> ParsedOptions:
    """parity's typed options; with ``--train``, train.py's job as ``train_job`` (None when a MODEL is compared)."""
    train_args = getattr(parsed, "train_args", None)  # the Python API gives MODEL's options alone
    return generated_options("parity", parsed, train_job=typed_options(TrainJob, train_args) if train_args else None)
