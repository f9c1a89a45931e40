"""validate.py's flags and the checks that need nothing but them, run before torch is imported."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.eval_flags import add_eval_model_args, add_split, add_threshold
from vtools.cli.options import (
    add_data_source_args,
    add_dataset_args,
    add_device_args,
    add_loader_args,
    add_loader_no_ops,
    add_model_args,
    add_naflex_refusals,
    add_preprocess_args,
    add_seed,
)
from vtools.cli.parser import OneLineParser, check_values
from vtools.cli.tracking_flags import add_mlflow_args
from vtools.options.evaluation import ValidateFlags
from vtools.options.shared import ResultFlags, TrackingFlags

DESCRIPTION = """Top-1 / top-5 validation of timm models on any device.

Examples:
  python validate.py /data/imagenet/val --model resnet50.a1_in1k --pretrained --device npu --amp
  python validate.py data/fashion-mnist-mini --model runs/fmnist/model --results-file results.csv
"""

NO_PREFETCHER_REASON = (
    "batches are always normalized on the device by vtools' loader; timm's prefetcher or not, the numbers are the same"
)
PIN_MEM_REASON = "vtools' loader pins host memory where the device gains from it; the numbers are the same either way"
NAFLEX_REASON = (
    "NaFlex batches (variable-resolution patch sequences) are not supported by vtools' device loader; "
    "validate NaFlexVit models at a fixed size (--img-size)"
)
NAFLEX_SEQ_REASON = (
    "only applies with --naflex-loader, which is not supported here; validate at a fixed size (--img-size)"
)
TIMM_VALIDATION_FLAGS = ("crop_border_pixels", "real_labels", "valid_labels", "retry")
REPORT_FLAGS = ("report", "report_worst", "calibration_bins")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("data")
    add_data_source_args(
        group, "DIR", "image folder with one sub-folder per class (or a root holding the --split folder)"
    )
    add_dataset_args(group)
    add_split(group, "validate")
    add_model_args(parser)
    add_eval_model_args(parser, "validate")
    add_preprocess_args(parser)
    group = parser.add_argument_group(ValidateFlags.title)
    add_declared(group, ValidateFlags, only=TIMM_VALIDATION_FLAGS)
    add_seed(group)
    add_declared(group, ValidateFlags, only=("metrics_avg", "num_samples", "tf_preprocessing"))
    add_loader_no_ops(group, pin_mem_reason=PIN_MEM_REASON, no_prefetcher_reason=NO_PREFETCHER_REASON)
    add_naflex_refusals(group, NAFLEX_REASON, seq_len_reason=NAFLEX_SEQ_REASON)
    add_loader_args(parser, batch_size=256)
    add_device_args(parser, cpu_fallback=True)
    group = parser.add_argument_group(ResultFlags.title)
    add_declared(group, ResultFlags, only=("results_file", "results_format"))
    add_declared(group, ValidateFlags, only=REPORT_FLAGS)
    add_threshold(group, "precision, recall and F1 in the results and the class report")
    add_mlflow_args(parser.add_argument_group(TrackingFlags.title), training=False)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """validate.py's options, with every check that reads only them done."""
    return check(build_parser().parse_args(argv))


def data_source(args: argparse.Namespace) -> str | None:
    """The data validate.py reads: SOURCE, else --data-dir."""
    return args.data or args.data_dir


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Every check of validate.py's options that reads several of them (one option's range: its declaration,
    checked as the parser reads it): the command line's and the Python API's."""
    check_values(args)
    return args
