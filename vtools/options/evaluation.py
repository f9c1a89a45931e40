"""validate.py's and inference.py's own options, each declared once (the flags they share with other
commands are in vtools/options/shared.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from vtools.options.declare import AT_LEAST_ONE, NOT_NEGATIVE, Allowed, no_op, option, refused
from vtools.options.values import CALIBRATION_BINS, LABEL_TYPE_CHOICES, METRICS_AVERAGE_CHOICES
from vtools.results import RESULT_FORMATS

NUM_SAMPLES_REASON = (
    "sets the length of a streamed split whose size is unknown; every source here knows its size, and one "
    "validation pass reads the whole split either way, as timm's does"
)
TF_PREPROCESSING_REASON = (
    "TensorFlow's preprocessing pipeline needs TensorFlow and is not supported here; timm's PIL preprocessing "
    "is used (adjust it with --crop-pct, --crop-mode, --interpolation)"
)


@dataclass(frozen=True, kw_only=True)
class ValidateFlags:
    """timm's validation flags and vtools' class report."""

    title: ClassVar[str] = "timm's validation flags"

    crop_border_pixels: int | None = option(
        "--crop-border-pixels",
        default=None,
        allowed=NOT_NEGATIVE,
        metavar="N",
        help="pixels cut from each image border first",
    )
    real_labels: str = option(
        "--real-labels",
        default="",
        metavar="FILE",
        help="ImageNet ReaL labels JSON: top-1/top-5 against the reassessed labels (ILSVRC2012 val files)",
    )
    valid_labels: str = option(
        "--valid-labels",
        default="",
        metavar="FILE",
        help="text file of output indices, one a line: score only those outputs, in that order "
        "(a set labelled in a part of the model's label space)",
    )
    retry: bool = option(
        "--retry",
        default=False,
        help="on running out of memory, retry with a smaller batch (always on when validating several models)",
    )
    metrics_avg: str | None = option(
        "--metrics-avg",
        default=None,
        choices=METRICS_AVERAGE_CHOICES,
        help="also report precision, recall and F1 of the top-1 predictions, averaged this way (as scikit-learn)",
    )
    num_samples: int | None = no_op("--num-samples", default=None, reason=NUM_SAMPLES_REASON)
    tf_preprocessing: bool = refused("--tf-preprocessing", default=False, reason=TF_PREPROCESSING_REASON)
    report: str = option(
        "--report",
        default="",
        metavar="DIR",
        help="write a class report here: per-class scores, confusion matrix, most-confused pairs, calibration "
        "(ECE, reliability diagram), misclassified images (one sub-folder per model when there are several)",
    )
    report_worst: int = option(
        "--report-worst",
        default=0,
        allowed=Allowed(lambda v: v >= 0, "must be 0 (every mistake) or more"),
        metavar="K",
        help="list only the K most confident mistakes in the report (default: 0, every mistake)",
    )
    calibration_bins: int = option(
        "--calibration-bins",
        default=CALIBRATION_BINS,
        allowed=AT_LEAST_ONE,
        metavar="N",
        help=f"equal-width confidence bins of the reliability diagram and ECE (default: {CALIBRATION_BINS})",
    )


@dataclass(frozen=True, kw_only=True)
class InferFlags:
    """What inference.py writes and prints: the top-k classes per image, in timm's columns."""

    title: ClassVar[str] = "output"

    topk: int = option(
        "--topk",
        default=1,
        allowed=Allowed(lambda v: v >= 0, "must be 0 (every class) or positive"),
        metavar="K",
        help="classes per image; 0 = every class (default: 1)",
    )
    output_type: Literal["prob", "logit"] = option(
        "--output-type",
        default="prob",
        help="softmax probabilities or raw logits (default: prob)",
    )
    label_type: str = option(
        "--label-type",
        default="description",
        choices=LABEL_TYPE_CHOICES,
        help="labels to print: ImageNet synset name, description or detailed description for "
        "ImageNet models, the stored class names otherwise (default: description)",
    )
    include_index: bool = option("--include-index", default=False, help="include class indices")
    fullname: bool = option("--fullname", default=False, help="full paths instead of file names")
    results_dir: str | None = option(
        "--results-dir", default=None, metavar="DIR", help="folder for results files (default: the current folder)"
    )
    # timm's inference.py: a file name inside --results-dir, written once per format (validate.py's is a path)
    results_file: str | None = option(
        "--results-file",
        default=None,
        metavar="NAME",
        help="results file name (default: <model>-topk<K>); one file per --results-format",
    )
    results_format: list[str] = option(
        "--results-format",
        default=["csv"],
        nargs="+",
        choices=RESULT_FORMATS,
        help="one or more of csv, json, jsonl (default: csv)",
    )
    no_console_results: bool = option("--no-console-results", default=False, help="do not print the results table")
    results_separate_col: bool = option(
        "--results-separate-col",
        default=False,
        help="one column per rank (index_0, label_0, prob_0, ...) instead of a list per column, when K > 1",
    )
    filename_col: str = option(
        "--filename-col", default="filename", metavar="NAME", help="file name column (default: filename)"
    )
    index_col: str = option(
        "--index-col", default="index", metavar="NAME", help="class index column(s) (default: index)"
    )
    label_col: str = option("--label-col", default="label", metavar="NAME", help="label column(s) (default: label)")
    output_col: str | None = option(
        "--output-col", default=None, metavar="NAME", help="score column(s) (default: the --output-type, prob or logit)"
    )
    exclude_output: bool = option(
        "--exclude-output",
        default=False,
        help="leave the scores out: only indices and labels (needs --topk 1 or more)",
    )
