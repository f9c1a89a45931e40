"""validate.py's flags and the checks that need nothing but them, run before torch is imported."""

from __future__ import annotations

import argparse

from vtools.cli.eval_flags import (
    add_eval_model_args,
    add_results_file_and_format,
    add_split,
    add_threshold,
    check_threshold,
)
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
from vtools.cli.timm_compat import add_no_op, add_refused
from vtools.cli.tracking_flags import add_mlflow_args
from vtools.errors import UsageError
from vtools.options.values import CALIBRATION_BINS, METRICS_AVERAGE_CHOICES

DESCRIPTION = """Top-1 / top-5 validation of timm models on any device.

Examples:
  python validate.py /data/imagenet/val --model resnet50.a1_in1k --pretrained --device npu --amp
  python validate.py data/fashion-mnist-mini --model runs/fmnist/model --results-file results.csv
"""

NUM_SAMPLES_REASON = (
    "sets the length of a streamed split whose size is unknown; every source here knows its size, and one "
    "validation pass reads the whole split either way, as timm's does"
)
NO_PREFETCHER_REASON = (
    "batches are always normalized on the device by vtools' loader; timm's prefetcher or not, the numbers are the same"
)
PIN_MEM_REASON = "vtools' loader pins host memory where the device gains from it; the numbers are the same either way"
TF_PREPROCESSING_REASON = (
    "TensorFlow's preprocessing pipeline needs TensorFlow and is not supported here; timm's PIL preprocessing "
    "is used (adjust it with --crop-pct, --crop-mode, --interpolation)"
)
NAFLEX_REASON = (
    "NaFlex batches (variable-resolution patch sequences) are not supported by vtools' device loader; "
    "validate NaFlexVit models at a fixed size (--img-size)"
)
NAFLEX_SEQ_REASON = (
    "only applies with --naflex-loader, which is not supported here; validate at a fixed size (--img-size)"
)


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
    group = parser.add_argument_group("timm's validation flags")
    group.add_argument(
        "--crop-border-pixels", type=int, default=None, metavar="N", help="pixels cut from each image border first"
    )
    group.add_argument(
        "--real-labels",
        default="",
        metavar="FILE",
        help="ImageNet ReaL labels JSON: top-1/top-5 against the reassessed labels (ILSVRC2012 val files)",
    )
    group.add_argument(
        "--valid-labels",
        default="",
        metavar="FILE",
        help="text file of output indices, one a line: score only those outputs, in that order "
        "(a set labelled in a part of the model's label space)",
    )
    group.add_argument(
        "--retry",
        action="store_true",
        default=False,
        help="on running out of memory, retry with a smaller batch (always on when validating several models)",
    )
    add_seed(group)
    group.add_argument(
        "--metrics-avg",
        default=None,
        choices=METRICS_AVERAGE_CHOICES,
        help="also report precision, recall and F1 of the top-1 predictions, averaged this way (as scikit-learn)",
    )
    add_no_op(group, "--num-samples", type=int, default=None, reason=NUM_SAMPLES_REASON)
    add_loader_no_ops(group, pin_mem_reason=PIN_MEM_REASON, no_prefetcher_reason=NO_PREFETCHER_REASON)
    add_refused(group, "--tf-preprocessing", action="store_true", default=False, reason=TF_PREPROCESSING_REASON)
    add_naflex_refusals(group, NAFLEX_REASON, seq_len_reason=NAFLEX_SEQ_REASON)
    add_loader_args(parser, batch_size=256)
    add_device_args(parser, cpu_fallback=True)
    group = parser.add_argument_group("results")
    add_results_file_and_format(group, "validate")
    group.add_argument(
        "--report",
        default="",
        metavar="DIR",
        help="write a class report here: per-class scores, confusion matrix, most-confused pairs, calibration "
        "(ECE, reliability diagram), misclassified images (one sub-folder per model when there are several)",
    )
    group.add_argument(
        "--report-worst",
        type=int,
        default=0,
        metavar="K",
        help="list only the K most confident mistakes in the report (default: 0, every mistake)",
    )
    group.add_argument(
        "--calibration-bins",
        type=int,
        default=CALIBRATION_BINS,
        metavar="N",
        help=f"equal-width confidence bins of the reliability diagram and ECE (default: {CALIBRATION_BINS})",
    )
    add_threshold(group, "precision, recall and F1 in the results and the class report")
    add_mlflow_args(parser.add_argument_group("experiment tracking"), training=False)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """validate.py's options, with every check that reads only them done."""
    return check(build_parser().parse_args(argv))


def data_source(args: argparse.Namespace) -> str | None:
    """The data validate.py reads: SOURCE, else --data-dir."""
    return args.data or args.data_dir


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Every check of validate.py's options that reads only them: the command line's and the Python API's."""
    check_values(args)
    check_threshold(args)
    if args.report:
        check_report_args(args)
    return args


def check_report_args(args: argparse.Namespace) -> None:
    """The report's options, before any model is created."""
    if args.report_worst < 0:
        raise UsageError(f"--report-worst must be 0 (every mistake) or more, got {args.report_worst}")
    if args.calibration_bins < 1:
        raise UsageError(f"--calibration-bins must be 1 or more, got {args.calibration_bins}")
