"""Top-1 / top-5 validation of timm models on any device.

Examples:
  python validate.py /data/imagenet/val --model resnet50.a1_in1k --pretrained --device npu --amp
  python validate.py data/fashion-mnist-mini --model runs/fmnist/model --results-file results.csv
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import timm

from vtools.cli.eval_flags import resolved_model_flags
from vtools.cli.typed import typed_options
from vtools.cli.validate_flags import build_parser as build_parser  # validate.py's parser, as tests reach it
from vtools.data.datasets import FileSamples, refuse_known_bad
from vtools.data.readers.folder import (
    labelled_images,
    resolve_split_dir,
)
from vtools.data.readers.label_file import find_label_file
from vtools.data.readers.registry import SourceRequest, open_source
from vtools.errors import RunFailed, UsageError
from vtools.evaluation.assembly import EvalOptions
from vtools.evaluation.batch_retry import with_smaller_batches
from vtools.evaluation.class_report import ClassReport
from vtools.evaluation.multilabel_metrics import MultiLabelReport
from vtools.evaluation.report_files import CONFUSION_CELLS, report_file_names
from vtools.evaluation.validation import ValidationOptions, validate_model
from vtools.models.create import model_files, model_label
from vtools.observe.fallback import CSV_NAME, FallbackWatch
from vtools.observe.profiling import StepProfiler
from vtools.observe.report_plots import CONFUSION_PNG, RELIABILITY_PNG, draw_report_or_why_not
from vtools.observe.run_trackers import validation_trackers
from vtools.observe.tracking import Trackers
from vtools.options.declare import ParsedOptions
from vtools.options.shared import SourceFlags, TrackingFlags
from vtools.outputs import Output, check_outputs
from vtools.results import format_table, write_rows
from vtools.runtime.distributed import refuse_torchrun
from vtools.runtime.options import RuntimeOptions
from vtools.runtime.resolve import Runtime, setup_runtime

CHECKPOINT_PATTERNS = ("*.pth.tar", "*.pth", "*.pt", "*.safetensors")
REPORT_NAMES = (*report_file_names(1), CONFUSION_CELLS, CONFUSION_PNG, RELIABILITY_PNG)  # what --report writes


def expand_models(pattern: str | None, pretrained: bool) -> list[str]:
    """One name, a comma-separated list, or a wildcard over timm's registry."""
    if not pattern:
        raise UsageError("--model is required (a timm name, hf-hub:..., or a model folder)")
    names: list[str] = []
    for part in (p.strip() for p in pattern.split(",") if p.strip()):
        if any(ch in part for ch in "*?[") and not Path(part).exists():
            matches = (
                timm.list_models(part, pretrained=pretrained)
                if pretrained
                else [m for m in timm.list_models() if fnmatch.fnmatch(m, part)]
            )
            if not matches:
                raise UsageError(f"--model {part}: no timm model matches")
            names.extend(matches)
        else:
            names.append(part)
    return names


def expand_checkpoints(spec: str) -> list[str]:
    """A file, a folder of checkpoints, or a glob; empty means no checkpoint."""
    if not spec:
        return [""]
    if os.path.isdir(spec):
        found = sorted({p for pattern in CHECKPOINT_PATTERNS for p in glob.glob(os.path.join(spec, pattern))})
        if not found:
            raise UsageError(f"--checkpoint {spec}: no checkpoints ({', '.join(CHECKPOINT_PATTERNS)}) in that folder")
        return found
    if any(ch in spec for ch in "*?["):
        found = sorted(glob.glob(spec))
        if not found:
            raise UsageError(f"--checkpoint {spec}: no file matches")
        return found
    return [spec]


def check_data_first(args: ParsedOptions) -> None:
    """The data's cheap checks (folder or shards exist, classes and images are there, columns are
    known), before any model is created or downloaded: a typo in the path must not cost a download,
    or a minute of retries offline."""
    if args.dataset.startswith("torch/"):
        return  # a torchvision set is checked when it is opened
    root = args.data or args.data_dir
    if not root:
        raise UsageError("give the data to validate (DIR or --data-dir)")
    if args.dataset or find_label_file(resolve_split_dir(root, args.split)):  # a labels file: its own checks
        open_source(SourceRequest.for_split(typed_options(SourceFlags, args), root, args.split))
    else:  # empty class folders are judged once the model says how labels are matched
        found = labelled_images(resolve_split_dir(root, args.split), check_empty=False)
        refuse_known_bad(FileSamples(found.entries.paths, unreadable=found.entries.unreadable), args.on_bad_image)


def validation_options(args: ParsedOptions) -> ValidationOptions:
    """validate.py's options as the library takes them: the pretrained config's test size unless
    --use-train-size."""
    evaluation = typed_options(EvalOptions, args, **resolved_model_flags(args), use_test_size=not args.use_train_size)
    return typed_options(ValidationOptions, args, evaluation=evaluation)


def validate_one(
    args: ParsedOptions,
    options: ValidationOptions,
    model_name: str,
    checkpoint: str,
    runtime: Runtime,
    report_dir: Path | None = None,
) -> dict[str, Any]:
    """Validate one model/checkpoint pair and return its results row (timm's keys first); with
    ``report_dir``, write its class report there and say where."""

    def profiled(loader: Iterable) -> Iterable:
        label = f"validate-{pair_name(model_name, checkpoint)}"
        return StepProfiler(args.profile, runtime.device, _profile_folder(args), label).wrap(loader)

    result = validate_model(model_name, checkpoint, options, runtime, report_dir, profiled)
    if isinstance(result.report, MultiLabelReport) and report_dir is not None:
        print(f"class report: {report_dir} (per-class AP, precision, recall and F1)")
    elif result.report is not None and report_dir is not None:
        print(f"class report: {report_dir} ({report_summary(result.report)}){draw_pictures(report_dir)}")
    return result.row


def check_paths(args: ParsedOptions, pairs: list[tuple[str, str]], reports: list[Path | None]) -> None:
    """Every file this validation writes (results, class reports, profiles) is apart from what it reads
    and from each other, and its folder takes a file, before any model is built or data read."""
    inputs = [
        ("the data folder", args.data or args.data_dir),
        ("--class-map", args.class_map),
        ("--valid-labels", args.valid_labels),
        ("--real-labels", args.real_labels),
    ]
    inputs += [found for model in dict.fromkeys(model for model, _ in pairs) for found in model_files(model)]
    inputs += [("--checkpoint", checkpoint) for checkpoint in dict.fromkeys(ckpt for _, ckpt in pairs)]
    outputs = []
    if args.results_file:
        outputs.append(Output("--results-file", Path(args.results_file)))
        outputs.append(Output("the --results-file's cpu fallbacks list", fallbacks_path(args.results_file)))
    several = len(pairs) > 1
    for (model, checkpoint), folder in zip(pairs, reports):
        if folder is not None:
            outputs.append(Output(f"the --report of {model}" if several else "--report", folder, REPORT_NAMES))
        if args.profile:
            trace = StepProfiler.trace_path(_profile_folder(args), f"validate-{pair_name(model, checkpoint)}")
            outputs.append(Output(f"the --profile trace of {model}" if several else "--profile trace", trace))
    check_outputs(inputs, outputs)


def fallbacks_path(results_file: str) -> Path:
    """Where the host-fallback list goes beside a results file: ``r.csv`` -> ``r.cpu_fallbacks.csv``."""
    return Path(results_file).with_suffix(f".{CSV_NAME}")


def _profile_folder(args: ParsedOptions) -> Path:
    """--profile traces go beside the results file, or into the current folder."""
    return Path(args.results_file or "results").parent


def report_summary(report: ClassReport) -> str:
    """The report's headline: averaged F1, calibration, and the most frequent mistake."""
    text = f"macro F1 {report.overall['macro_f1_score']:.2f}, ECE {report.overall['ece']:.2f}%"
    if report.pairs:
        pair = report.pairs[0]
        text += f", most confused: {pair['true']} -> {pair['predicted']} ({pair['count']})"
    return text


def draw_pictures(folder: Path) -> str:
    """The report's PNGs, or a note on why there are none."""
    missing = draw_report_or_why_not(folder)
    return f"; no pictures: {missing}" if missing is not None else ""


def report_folders(spec: str, pairs: list[tuple[str, str]]) -> list[Path | None]:
    """Where each model/checkpoint pair's class report goes: ``spec`` itself for one pair, else one
    sub-folder per pair named after the model (and checkpoint)."""
    if not spec:
        return [None] * len(pairs)
    if len(pairs) == 1:
        return [Path(spec)]
    return [Path(spec) / pair_name(model, checkpoint) for model, checkpoint in pairs]


def pair_name(model: str, checkpoint: str) -> str:
    """A model/checkpoint pair's name in the files written for it: its report folder, its profile trace."""
    return model_label(model) + (f"-{Path(checkpoint).name.split('.')[0]}" if checkpoint else "")


def validate_with_retry(
    args: ParsedOptions,
    options: ValidationOptions,
    model_name: str,
    checkpoint: str,
    runtime: Runtime,
    retry: bool,
    report_dir: Path | None = None,
) -> dict[str, Any]:
    """timm's --retry: on an out-of-memory error, validate again with the next smaller batch size."""

    def attempt(batch_size: int) -> dict[str, Any]:
        smaller = dataclasses.replace(options.evaluation, batch_size=batch_size)
        retried = dataclasses.replace(options, evaluation=smaller)
        return validate_one(args, retried, model_name, checkpoint, runtime, report_dir)

    return with_smaller_batches(attempt, options.evaluation.batch_size, retry, model_name)


def _skipped_text(row: dict[str, Any]) -> str:
    """How many images the set has and how many of them were skipped, when some were."""
    if not row["skipped"]:
        return ""
    return f" ({row['samples'] + row['skipped']} found, {row['skipped']} unreadable skipped)"


def _metrics_line(row: dict[str, Any], average: str | None) -> str:
    if not average:
        return ""
    return (
        f" | Precision({average}) {row[f'{average}_precision']:.3f} | Recall({average}) "
        f"{row[f'{average}_recall']:.3f} | F1-score({average}) {row[f'{average}_f1_score']:.3f}"
    )


def run(args: ParsedOptions) -> int:
    """Validate with the command line's options (vtools/cli/validate_flags.py parses them before torch loads)."""
    validate_models(args)
    return 0


def validate_models(args: ParsedOptions) -> list[dict[str, Any]]:
    """validate.py's whole run (printing, the --results-file, a one-line error when a model failed): the
    results rows, as written to --results-file."""
    refuse_torchrun("validate.py")
    runtime = setup_runtime(typed_options(RuntimeOptions, args))
    models = expand_models(args.model, args.pretrained)
    checkpoints = expand_checkpoints(args.checkpoint)
    pairs = [(model_name, checkpoint) for model_name in models for checkpoint in checkpoints]
    reports = report_folders(args.report, pairs)
    check_paths(args, pairs, reports)
    check_data_first(args)
    tags = {"dataset": str(args.dataset or args.data_dir or args.data or ""), "device": str(runtime.device)}
    with validation_trackers(typed_options(TrackingFlags, args), tracked_options(args), tags, print) as trackers:
        with FallbackWatch(runtime.device.type, fatal=args.no_cpu_fallback) as fallbacks:
            rows, failures = validate_pairs(args, pairs, reports, runtime, trackers)
        print(format_table(rows, result_columns(rows) + (["checkpoint"] if args.checkpoint else [])))
        fallbacks_file = None
        if args.results_file and rows:
            write_rows(args.results_file, rows, args.results_format)
            print(f"results written to {args.results_file}")
            fallbacks_file = fallbacks.write_csv(fallbacks_path(args.results_file))
        print(fallbacks.summary(str(fallbacks_file) if fallbacks_file else None))
    if failures:
        raise models_failed(failures, len(pairs), args.results_file if rows else "")
    return rows


def tracked_options(args: ParsedOptions) -> dict[str, Any]:
    """The options a validation run's MLflow params record (not where they are recorded)."""
    return {key: value for key, value in args.values().items() if key not in ("log_mlflow", "mlflow_experiment")}


RESULT_COLUMNS = [  # the console table's columns
    *("model", "top1", "top5", "loss", "samples"),
    *("param_count", "img_size", "device", "amp_dtype", "img_per_sec"),
]


def result_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The console table's columns: a multi-label split's rows show mAP and F1 where top-k would be."""
    if not rows or "map" not in rows[0]:
        return RESULT_COLUMNS
    return ["model", "map", "map_micro", "f1", *RESULT_COLUMNS[3:]]


def validate_pairs(
    args: ParsedOptions,
    pairs: list[tuple[str, str]],
    reports: list[Path | None],
    runtime: Runtime,
    trackers: Trackers,
) -> tuple[list[dict[str, Any]], list[tuple[str, Exception]]]:
    """Validate every model/checkpoint pair, saying each one's figures (and sending them to the trackers);
    with several, one that fails is named and the others go on, as in timm's bulk validation."""
    options = validation_options(args)
    rows, failures = [], []
    retry = args.retry or len(pairs) > 1  # timm retries every model of a bulk run
    for (model_name, checkpoint), report_dir in zip(pairs, reports):
        try:
            row = validate_with_retry(args, options, model_name, checkpoint, runtime, retry, report_dir)
        except (UsageError, RunFailed) as err:
            if len(pairs) == 1:
                raise
            name = model_name + (f" @ {checkpoint}" if checkpoint else "")
            failures.append((name, err))
            print(f" * {name}: not validated: {err}", flush=True)
            continue
        scores = (
            f"mAP {row['map']:.3f} (micro {row['map_micro']:.3f}) F1 {row['f1']:.3f} at {row['threshold']}"
            if "map" in row
            else f"Acc@1 {row['top1']:.3f} ({row['top1_err']:.3f}) Acc@5 {row['top5']:.3f} ({row['top5_err']:.3f})"
        )
        print(
            f" * {row['model']}{' @ ' + checkpoint if checkpoint else ''}: {scores} "
            f"loss {row['loss']:.4f} on {row['samples']} images{_skipped_text(row)}, {row['img_per_sec']:.1f} img/s"
            + _metrics_line(row, args.metrics_avg),
            flush=True,
        )
        rows.append(row)
        trackers.result(row)
    return rows, failures


def models_failed(failures: list[tuple[str, Exception]], total: int, results_file: str) -> UsageError | RunFailed:
    """The one line that ends a validation of several models some of which failed: the first failure's
    reason, the other failed models, and where the finished rows are. Exit 2 when any failure is input the
    user can fix (a wrong name, a model that does not fit the data), else 3 (a run that failed on its own):
    either way a script sees that rows are missing."""
    model, error = failures[0]
    text = f"{len(failures)} of {total} models failed: " + (str(error) if model in str(error) else f"{model}: {error}")
    if len(failures) > 1:
        text += f" (and {', '.join(name for name, _ in failures[1:])}: see above)"
    if results_file:
        text += f"; the results of the other {total - len(failures)} are in {results_file}"
    kind = UsageError if any(isinstance(err, UsageError) for _, err in failures) else RunFailed
    return kind(text)
