"""Top-1 / top-5 validation of timm models on any device.

Examples:
  python validate.py /data/imagenet/val --model resnet50.a1_in1k --pretrained --device npu --amp
  python validate.py data/fashion-mnist-mini --model runs/fmnist/model --results-file results.csv
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import glob
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from timm.utils import check_batch_size_retry, decay_batch_step, random_seed

from vtools.cli.options import (
    add_data_source_args,
    add_dataset_args,
    add_device_args,
    add_loader_args,
    add_model_args,
    add_preprocess_args,
    model_in_chans,
    preprocess_overrides,
    timm_model_kwargs,
)
from vtools.cli.parser import OneLineParser, check_values
from vtools.cli.timm_compat import add_no_op, add_refused
from vtools.data.datasets import FileSamples, refuse_known_bad
from vtools.data.decode import bad_image_handler
from vtools.data.loaders import DeviceLoader, eval_device_loader
from vtools.data.memory_estimate import LoaderUse, check_host_memory
from vtools.data.readers.folder import (
    eval_class_map,
    find_class_folders,
    labelled_images,
    resolve_split_dir,
)
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.data.transforms import data_config_for, eval_transform, image_mode
from vtools.errors import RunFailed, UsageError
from vtools.evaluation.class_report import DEFAULT_BINS, ClassReport, build_report
from vtools.evaluation.loops import evaluate
from vtools.evaluation.metrics import (
    METRICS_AVERAGES,
    ClassCounts,
    RealLabels,
    check_valid_labels,
    read_valid_labels,
)
from vtools.evaluation.model_flags import add_eval_model_args, check_input_mode, ready_for_eval, reparameterized
from vtools.evaluation.predictions import PredictionLog
from vtools.evaluation.report_files import CONFUSION_CELLS, report_file_names, write_report
from vtools.models.activation_memory import activation_bytes_per_image
from vtools.models.create import create_model, model_files, model_label
from vtools.models.folder import class_names_of
from vtools.models.prepare import count_params, use_channels_last
from vtools.observe.fallback import CSV_NAME, FallbackWatch
from vtools.observe.profiling import StepProfiler
from vtools.observe.report_plots import CONFUSION_PNG, RELIABILITY_PNG, draw_report
from vtools.outputs import Output, check_outputs
from vtools.results import format_table, write_rows
from vtools.runtime.distributed import refuse_torchrun
from vtools.runtime.resolve import Runtime, setup_runtime

CHECKPOINT_PATTERNS = ("*.pth.tar", "*.pth", "*.pt", "*.safetensors")
REPORT_NAMES = (*report_file_names(1), CONFUSION_CELLS, CONFUSION_PNG, RELIABILITY_PNG)  # what --report writes

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
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("data")
    add_data_source_args(
        group, "DIR", "image folder with one sub-folder per class (or a root holding the --split folder)"
    )
    add_dataset_args(group)
    group.add_argument(
        "--split",
        default="validation",
        help="split to validate: folder, split name or shard pattern (default: validation)",
    )
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
    group.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
    group.add_argument(
        "--metrics-avg",
        default=None,
        choices=METRICS_AVERAGES,
        help="also report precision, recall and F1 of the top-1 predictions, averaged this way (as scikit-learn)",
    )
    add_no_op(group, "--num-samples", type=int, default=None, reason=NUM_SAMPLES_REASON)
    add_no_op(group, "--no-prefetcher", action="store_true", default=False, reason=NO_PREFETCHER_REASON)
    add_no_op(group, "--pin-mem", action="store_true", default=False, reason=PIN_MEM_REASON)
    add_refused(group, "--tf-preprocessing", action="store_true", default=False, reason=TF_PREPROCESSING_REASON)
    add_refused(group, "--naflex-loader", action="store_true", default=False, reason=NAFLEX_REASON)
    add_refused(group, "--naflex-max-seq-len", type=int, default=576, reason=NAFLEX_SEQ_REASON)
    add_loader_args(parser, batch_size=256)
    add_device_args(parser, cpu_fallback=True)
    group = parser.add_argument_group("results")
    group.add_argument("--results-file", default="", metavar="PATH", help="write one row per model here")
    group.add_argument("--results-format", default="csv", choices=("csv", "json"), help="(default: csv)")
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
        default=DEFAULT_BINS,
        metavar="N",
        help=f"equal-width confidence bins of the reliability diagram and ECE (default: {DEFAULT_BINS})",
    )
    return parser


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


def check_data_first(args: argparse.Namespace) -> None:
    """The data's cheap checks (folder or shards exist, classes and images are there, columns are
    known), before any model is created or downloaded: a typo in the path must not cost a download,
    or a minute of retries offline."""
    if args.dataset.startswith("torch/"):
        return  # a torchvision set is checked when it is opened
    root = args.data or args.data_dir
    if not root:
        raise UsageError("give the data to validate (DIR or --data-dir)")
    if args.dataset:
        open_source(_request(args))
    else:  # empty class folders are judged once the model says how labels are matched
        found = labelled_images(resolve_split_dir(root, args.split), check_empty=False)
        refuse_known_bad(FileSamples(found.entries.paths, unreadable=found.entries.unreadable), args.on_bad_image)


def _request(args: argparse.Namespace, class_map: dict[str, int] | None = None) -> SourceRequest:
    return SourceRequest(
        args.dataset,
        args.data or args.data_dir or "",
        args.split,
        args.dataset_download,
        args.input_key,
        args.target_key,
        class_map,
    )


def build_eval_loader(
    args: argparse.Namespace,
    outputs: int,
    class_names: list[str] | None,
    data_config: dict,
    runtime: Runtime,
    channels_last: bool,
    skipped: list[str],
    activations: Callable[[], int | None] | None = None,
) -> tuple[DeviceLoader, Source]:
    """The validation set, as normalized batches on the device, for a model with ``outputs`` scored
    outputs named ``class_names`` (after --valid-labels). Class folders are matched to those names;
    other sources carry their labels as stored. Refused first when its batches cannot fit in the host's
    memory (``activations``: the model's activation bytes per image, for a model on the host's cores)."""
    class_map = None
    if not args.dataset:
        split_dir = resolve_split_dir(args.data or args.data_dir, args.split)
        classes = find_class_folders(split_dir)
        class_map, how = eval_class_map(classes, args.class_map, outputs, class_names, split_dir)
    source = open_source(_request(args, class_map))
    if args.dataset:
        print(f"{source.description}; labels as the dataset stores them")
    else:
        print(f"{split_dir}: {len(classes)} class folders, {len(source)} images; {how}")
    labels = getattr(source.samples, "labels", None)  # folders: known up front
    if (max(labels) if labels else len(source.classes or []) - 1) >= outputs:
        raise UsageError(_too_many_classes(source, args.model, outputs))
    mode = image_mode(data_config, args.input_img_mode)
    check_input_mode(mode, data_config)
    dataset = source.images(eval_transform(data_config, args.crop_border_pixels), mode)
    check_host_memory(
        [LoaderUse("validation", data_config, source.samples)],
        args.batch_size,
        runtime.device,
        runtime.budget.workers,
        activations,
    )
    loader = eval_device_loader(
        dataset,
        args.batch_size,
        runtime.device,
        runtime.budget.workers,
        data_config,
        channels_last,
        bad_image_handler(args.on_bad_image, skipped),
        dtype=runtime.model_dtype,
    )
    return loader, source


def _too_many_classes(source: Source, model_name: str, outputs: int) -> str:
    """Why the data's labels do not fit the model, naming empty class folders (they still count)."""
    names = source.classes or []
    used = set(getattr(source.samples, "labels", range(len(names))))
    empty = [name for index, name in enumerate(names) if index not in used]
    message = f"{source.description} has {len(names)} classes but {model_name} has {outputs} outputs"
    if empty:
        message += f" ({', '.join(empty[:3])}{' ...' if len(empty) > 3 else ''} holds no images but counts as a class)"
    return message + "; pass --class-map or a model trained on these classes"


def validate_one(
    args: argparse.Namespace, model_name: str, checkpoint: str, runtime: Runtime, report_dir: Path | None = None
) -> dict[str, Any]:
    """Validate one model/checkpoint pair and return its results row (timm's keys first); with
    ``report_dir``, write its class report there."""
    pretrained = args.pretrained or not checkpoint  # as timm's validate.py: no checkpoint -> pretrained weights
    random_seed(args.seed)  # as timm's validate.py, before the model and the loader (--interpolation random)
    model = create_model(
        model_name,
        pretrained=pretrained,
        num_classes=args.num_classes,
        in_chans=model_in_chans(args),
        model_kwargs=timm_model_kwargs(args),
        checkpoint=checkpoint or None,
        use_ema=args.use_ema,
        device=runtime.device,
    )
    if args.reparam:
        model = reparameterized(model)
    param_count = count_params(model)
    data_config = data_config_for(model, preprocess_overrides(args), use_test_size=not args.use_train_size)
    outputs, class_names = model.num_classes, class_names_of(model)
    valid_labels = None
    if args.valid_labels:
        valid_labels = read_valid_labels(args.valid_labels)
        check_valid_labels(valid_labels, outputs, args.valid_labels)
        outputs = len(valid_labels)
        class_names = [class_names[i] for i in valid_labels] if class_names else None
    skipped: list[str] = []
    channels_last = use_channels_last(args.channels_last, model, runtime.device)
    plain = model  # measured on the meta device before torch.compile wraps it

    def activations() -> int | None:
        return activation_bytes_per_image(plain, data_config["input_size"], training=False)

    model = ready_for_eval(args, model, data_config, runtime.model_dtype, channels_last)  # --test-pool: crop 1.0
    loader, source = build_eval_loader(
        args, outputs, class_names, data_config, runtime, channels_last, skipped, activations
    )
    counts = ClassCounts(outputs, runtime.device) if args.metrics_avg else None
    real = _real_labels(args.real_labels, source, outputs) if args.real_labels else None
    log = PredictionLog() if report_dir is not None else None

    def on_logits(logits: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        if counts is not None:
            counts.update(logits, targets)
        if real is not None:
            real.add(logits, indices)
        if log is not None:
            log.add(logits, targets, indices)

    profiler = StepProfiler(
        args.profile, runtime.device, _profile_folder(args), f"validate-{pair_name(model_name, checkpoint)}"
    )
    result = evaluate(
        model,
        profiler.wrap(loader),
        runtime.device,
        runtime.amp,
        desc=Path(model_name).name,
        log=print,
        log_freq=args.log_freq,
        output_index=valid_labels,
        on_logits=on_logits if counts is not None or real is not None or log is not None else None,
    )
    if result.count == 0:
        raise UsageError(f"no image could be read ({len(skipped)} skipped): there is nothing to validate on")
    if not math.isfinite(result.loss):
        raise RunFailed(
            f"{model_name}: the loss over {result.count} images is {result.loss}: the model's outputs are not "
            "finite (weights with nan or inf in them?), so its accuracy means nothing"
        )
    top1, top5 = (real.accuracy(1), real.accuracy(5)) if real is not None else (result.top1, result.top5)
    if log is not None:
        names = class_names or [str(i) for i in range(outputs)]
        about = {"model": model_name, "checkpoint": checkpoint, "device": str(runtime.device)}
        report = build_report(
            log.gather(runtime.device),
            names,
            getattr(source.samples, "name", None),
            args.calibration_bins,
            args.report_worst,
            about,
        )
        write_report(report_dir, report)
        print(f"class report: {report_dir} ({report_summary(report)}){draw_pictures(report_dir)}")
    return {
        "model": model_name,
        "top1": round(top1, 4),
        "top1_err": round(100 - top1, 4),
        "top5": round(top5, 4),
        "top5_err": round(100 - top5, 4),
        **(counts.row(args.metrics_avg) if counts is not None else {}),
        "param_count": round(param_count / 1e6, 2),
        "img_size": data_config["input_size"][-1],
        "crop_pct": data_config["crop_pct"],
        "interpolation": data_config["interpolation"],
        "loss": round(result.loss, 6),
        "samples": result.count,
        "skipped": len(skipped),
        "device": str(runtime.device),
        "amp_dtype": runtime.amp.dtype_name,
        "channels_last": channels_last,
        "img_per_sec": round(result.images_per_second, 2),
        "checkpoint": checkpoint,
    }


def check_report_args(args: argparse.Namespace) -> None:
    """The report's options, before any model is created."""
    if args.report_worst < 0:
        raise UsageError(f"--report-worst must be 0 (every mistake) or more, got {args.report_worst}")
    if args.calibration_bins < 1:
        raise UsageError(f"--calibration-bins must be 1 or more, got {args.calibration_bins}")


def check_paths(args: argparse.Namespace, pairs: list[tuple[str, str]], reports: list[Path | None]) -> None:
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
    outputs = [Output("--results-file", Path(args.results_file))] if args.results_file else []
    several = len(pairs) > 1
    for (model, checkpoint), folder in zip(pairs, reports):
        if folder is not None:
            outputs.append(Output(f"the --report of {model}" if several else "--report", folder, REPORT_NAMES))
        if args.profile:
            trace = StepProfiler.trace_path(_profile_folder(args), f"validate-{pair_name(model, checkpoint)}")
            outputs.append(Output(f"the --profile trace of {model}" if several else "--profile trace", trace))
    check_outputs(inputs, outputs)


def _profile_folder(args: argparse.Namespace) -> Path:
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
    try:
        draw_report(folder)
    except UsageError as missing:
        return f"; no pictures: {missing}"
    return ""


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


def _real_labels(real_json: str, source: Source, outputs: int) -> RealLabels:
    name_of = getattr(source.samples, "name", None)
    if name_of is None:
        raise UsageError("--real-labels needs image files with their ILSVRC2012 names (an image folder or shards)")
    return RealLabels(real_json, name_of, len(source), outputs)


def validate_with_retry(
    args: argparse.Namespace,
    model_name: str,
    checkpoint: str,
    runtime: Runtime,
    retry: bool,
    report_dir: Path | None = None,
) -> dict[str, Any]:
    """timm's --retry: on an out-of-memory error, validate again with the next smaller batch size
    (timm's decay_batch_step); errors that a smaller batch cannot cure stop the run as they are."""
    initial = args.batch_size
    try:
        while True:
            try:
                return validate_one(args, model_name, checkpoint, runtime, report_dir)
            except RuntimeError as err:
                smaller = decay_batch_step(args.batch_size)
                if not retry or not smaller or not check_batch_size_retry(str(err)) or not _out_of_memory(err):
                    raise
                print(
                    f"{model_name}: {str(err).splitlines()[0]} at batch size {args.batch_size}; retrying with {smaller}"
                )
                args.batch_size = smaller
                gc.collect()
                if hasattr(torch, "accelerator") and torch.accelerator.is_available():
                    torch.accelerator.empty_cache()
    finally:
        args.batch_size = initial


def _out_of_memory(err: RuntimeError) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    refuse_torchrun("validate.py")
    check_values(args)
    runtime = setup_runtime(args)
    if args.report:
        check_report_args(args)
    models = expand_models(args.model, args.pretrained)
    checkpoints = expand_checkpoints(args.checkpoint)
    pairs = [(model_name, checkpoint) for model_name in models for checkpoint in checkpoints]
    reports = report_folders(args.report, pairs)
    check_paths(args, pairs, reports)
    check_data_first(args)
    rows, failures = [], []
    retry = args.retry or len(pairs) > 1  # timm retries every model of a bulk run
    with FallbackWatch(runtime.device.type, fatal=args.no_cpu_fallback) as fallbacks:
        for (model_name, checkpoint), report_dir in zip(pairs, reports):
            try:
                row = validate_with_retry(args, model_name, checkpoint, runtime, retry, report_dir)
            except (UsageError, RunFailed) as err:
                if len(pairs) == 1:
                    raise
                name = model_name + (f" @ {checkpoint}" if checkpoint else "")
                failures.append((name, err))  # as timm's bulk validation: the other models still run
                print(f" * {name}: not validated: {err}", flush=True)
                continue
            print(
                f" * {row['model']}{' @ ' + checkpoint if checkpoint else ''}: Acc@1 {row['top1']:.3f} "
                f"({row['top1_err']:.3f}) Acc@5 {row['top5']:.3f} ({row['top5_err']:.3f}) "
                f"loss {row['loss']:.4f} on {row['samples']} images{_skipped_text(row)}, {row['img_per_sec']:.1f} img/s"
                + _metrics_line(row, args.metrics_avg),
                flush=True,
            )
            rows.append(row)
    columns = [
        "model",
        "top1",
        "top5",
        "loss",
        "samples",
        "param_count",
        "img_size",
        "device",
        "amp_dtype",
        "img_per_sec",
    ]
    print(format_table(rows, columns + (["checkpoint"] if args.checkpoint else [])))
    fallbacks_file = None
    if args.results_file and rows:
        write_rows(args.results_file, rows, args.results_format)
        print(f"results written to {args.results_file}")
        fallbacks_file = fallbacks.write_csv(Path(args.results_file).with_suffix(f".{CSV_NAME}"))
    print(fallbacks.summary(str(fallbacks_file) if fallbacks_file else None))
    if failures:
        raise models_failed(failures, len(pairs), args.results_file if rows else "")
    return 0


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
