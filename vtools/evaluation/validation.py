"""One model/checkpoint pair validated on a labelled split: validate.py's row, and its class report.

The split's labels are matched to the model's scored outputs (class folders by name,
--valid-labels picking outputs), the model is evaluated through the shared assembly
(:mod:`vtools.evaluation.assembly`), and timm's row is made from the pass: top-1/top-5
(against ReaL labels with --real-labels), averaged precision/recall/F1 with
--metrics-avg, and the class report's tables when one is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.utils import random_seed

from vtools.data.readers.folder import eval_class_map, read_class_map, resolve_split_dir
from vtools.data.readers.label_file import find_label_file
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.data.readers.split_scan import find_class_folders
from vtools.errors import RunFailed, UsageError
from vtools.evaluation.assembly import EvalModel, EvalOptions
from vtools.evaluation.class_report import ClassReport, build_report
from vtools.evaluation.loops import EvalResult, evaluate
from vtools.evaluation.metrics import ClassCounts, RealLabels, check_valid_labels, read_valid_labels
from vtools.evaluation.multilabel_eval import ScoreLog, scored, write_multilabel_report
from vtools.evaluation.multilabel_metrics import MultiLabelReport
from vtools.evaluation.predictions import PredictionLog
from vtools.evaluation.report_files import write_report
from vtools.models.folder import class_names_of
from vtools.runtime.resolve import Runtime


@dataclass(frozen=True)
class ValidationOptions:
    """validate.py's options for one pass. Field names are the flags' dests; the command builds it
    (``vtools.cli.typed.typed_options``) with ``evaluation`` built the same way and given as an override."""

    evaluation: EvalOptions  # the model and its loader
    dataset: str
    dataset_download: bool
    input_key: str | None
    target_key: str | None
    data: str | None
    data_dir: str | None
    split: str
    class_map: str
    model: str  # --model as given, for messages
    seed: int
    valid_labels: str
    real_labels: str
    metrics_avg: str | None
    calibration_bins: int
    report_worst: int
    log_freq: int
    threshold: float  # multi-label data: the probability from which a class counts as predicted

    @property
    def root(self) -> str:
        """The folder or store validated: DIR, else --data-dir."""
        return self.data or self.data_dir or ""


@dataclass(frozen=True)
class ScoredOutputs:
    """The model outputs a validation scores: all of them, or those --valid-labels names, in its order."""

    count: int
    class_names: list[str] | None
    index: list[int] | None  # --valid-labels: the outputs scored, in order

    @classmethod
    def of(cls, model: torch.nn.Module, valid_labels_file: str) -> ScoredOutputs:
        outputs, class_names = model.num_classes, class_names_of(model)
        if not valid_labels_file:
            return cls(outputs, class_names, None)
        valid_labels = read_valid_labels(valid_labels_file)
        check_valid_labels(valid_labels, outputs, valid_labels_file)
        names = [class_names[i] for i in valid_labels] if class_names else None
        return cls(len(valid_labels), names, valid_labels)


@dataclass
class Validation:
    """A validated pair: its results row (timm's keys first) and its class report, when one was asked for."""

    row: dict[str, Any]
    report: ClassReport | MultiLabelReport | None


def open_validation_source(
    options: ValidationOptions, outputs: ScoredOutputs, say: Callable[[str], None] = print
) -> Source:
    """The split to validate, its labels matched to the scored outputs: class folders by their names
    (or --class-map), other sources as they store them; refused when a label is beyond the outputs."""
    class_map = None
    labels_file = None
    if not options.dataset:
        split_dir = resolve_split_dir(options.root, options.split)
        labels_file = find_label_file(split_dir)
    if labels_file is not None:  # multi-label: the file's class names are the model's (or --class-map's)
        names = outputs.class_names
        class_map = read_class_map(options.class_map) if options.class_map else None
        class_map = class_map or ({name: index for index, name in enumerate(names)} if names else None)
        how = "classes by --class-map" if options.class_map else "classes by the model's names"
    elif not options.dataset:
        classes = find_class_folders(split_dir)
        class_map, how = eval_class_map(classes, options.class_map, outputs.count, outputs.class_names, split_dir)
    source = open_source(SourceRequest.for_split(options, options.root, options.split, class_map))
    if options.dataset:
        say(f"{source.description}; labels as the dataset stores them")
    elif labels_file is not None:
        say(f"{source.description}; {how if class_map else 'classes as the file names them'}")
    else:
        say(f"{split_dir}: {len(classes)} class folders, {len(source)} images; {how}")
    sets = source.samples.label_sets
    if sets is not None and sets.num_classes > outputs.count:
        raise UsageError(
            f"{source.description} has {sets.num_classes} classes but {options.model} has {outputs.count} outputs; "
            "pass --class-map or a model trained on these classes"
        )
    if source.highest_label() >= outputs.count:
        raise UsageError(too_many_classes(source, options.model, outputs.count))
    return source


def too_many_classes(source: Source, model_name: str, outputs: int) -> str:
    """Why the data's labels do not fit the model, naming empty class folders (they still count)."""
    names = source.classes or []
    labels = source.samples.labels
    used = set(labels if labels is not None else range(len(names)))
    empty = [name for index, name in enumerate(names) if index not in used]
    message = f"{source.description} has {len(names)} classes but {model_name} has {outputs} outputs"
    if empty:
        message += f" ({', '.join(empty[:3])}{' ...' if len(empty) > 3 else ''} holds no images but counts as a class)"
    return message + "; pass --class-map or a model trained on these classes"


class LogitWatchers:
    """What a validation reads from the logits besides top-k: averaged metrics, ReaL labels, the
    per-sample predictions of the class report; each only when asked for."""

    def __init__(
        self,
        options: ValidationOptions,
        source: Source,
        outputs: int,
        device: torch.device,
        report: bool,
        multi_label: bool = False,
    ) -> None:
        if multi_label:  # every sample's scores, for mAP and F1; top-k figures do not apply
            for flag, given in (("--metrics-avg", options.metrics_avg), ("--real-labels", options.real_labels)):
                if given:
                    raise UsageError(f"{flag} scores single-label data; {source.description} is multi-label")
        self.counts = ClassCounts(outputs, device) if options.metrics_avg else None
        self.real = real_labels(options.real_labels, source, outputs) if options.real_labels else None
        self.log = PredictionLog() if report and not multi_label else None
        self.scores = ScoreLog() if multi_label else None

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        if self.scores is not None:
            self.scores.add(logits, targets, indices)
            return
        if self.counts is not None:
            self.counts.update(logits, targets)
        if self.real is not None:
            self.real.add(logits, indices)
        if self.log is not None:
            self.log.add(logits, targets, indices)

    def any(self) -> bool:
        return self.counts is not None or self.real is not None or self.log is not None or self.scores is not None


def real_labels(real_json: str, source: Source, outputs: int) -> RealLabels:
    """timm's ReaL evaluation, which finds the images by their file names."""
    name_of = source.sample_names()
    if name_of is None:
        raise UsageError("--real-labels needs image files with their ILSVRC2012 names (an image folder or shards)")
    return RealLabels(real_json, name_of, len(source), outputs)


def validate_model(
    name: str,
    checkpoint: str,
    options: ValidationOptions,
    runtime: Runtime,
    report_dir: Path | None = None,
    wrap: Callable[[Iterable], Iterable] = lambda loader: loader,
    say: Callable[[str], None] = print,
) -> Validation:
    """Validate ``name`` with ``checkpoint``'s weights (pretrained ones without) and make its row; with
    ``report_dir``, write its class report there. ``wrap`` wraps the loader (a step profiler)."""
    random_seed(options.seed)  # as timm's validate.py, before the model and the loader (--interpolation random)
    model = EvalModel.load(name, checkpoint, options.evaluation, runtime)
    outputs = ScoredOutputs.of(model.module, options.valid_labels)
    model.ready(options.evaluation, runtime)  # --test-pool: crop 1.0
    source = open_validation_source(options, outputs, say)
    skipped: list[str] = []
    loader = model.loader(source, options.evaluation, runtime, "validation", skipped)
    multi_label = source.samples.label_sets is not None
    watchers = LogitWatchers(options, source, outputs.count, runtime.device, report_dir is not None, multi_label)
    result = evaluate(
        model.module,
        wrap(loader),
        runtime.device,
        runtime.amp,
        desc=Path(name).name,
        log=say,
        log_freq=options.log_freq,
        output_index=outputs.index,
        on_logits=watchers if watchers.any() else None,
    )
    check_result(result, name, len(skipped))
    report: ClassReport | MultiLabelReport | None = None
    if watchers.scores is not None:
        names = outputs.class_names or [str(i) for i in range(outputs.count)]
        gathered = watchers.scores.gather(runtime.device, outputs.count)
        result, report = scored(result, gathered, options.threshold, names)
        if report_dir is not None:
            about = {"model": name, "checkpoint": checkpoint, "device": str(runtime.device)}
            write_multilabel_report(report_dir, report, about)
    elif watchers.log is not None and report_dir is not None:
        about = {"model": name, "checkpoint": checkpoint, "device": str(runtime.device)}
        names = outputs.class_names or [str(i) for i in range(outputs.count)]
        predictions = watchers.log.gather(runtime.device)
        report = build_report(
            predictions, names, source.sample_names(), options.calibration_bins, options.report_worst, about
        )
        write_report(report_dir, report)
    return Validation(result_row(name, checkpoint, options, runtime, model, result, watchers, len(skipped)), report)


def check_result(result: EvalResult, name: str, skipped: int) -> None:
    """A pass over no image, or whose outputs overflowed (a loss that is not finite, or a saturating chip's
    raised float-status flag), has no accuracy to report."""
    if result.count == 0:
        raise UsageError(f"no image could be read ({skipped} skipped): there is nothing to validate on")
    if result.overflowed:
        raise RunFailed(
            f"{name}: the loss over {result.count} images {result.overflow_words()}: the model's outputs are not "
            "finite (weights with nan or inf in them?), so its accuracy means nothing"
        )


def result_row(
    name: str,
    checkpoint: str,
    options: ValidationOptions,
    runtime: Runtime,
    model: EvalModel,
    result: EvalResult,
    watchers: LogitWatchers,
    skipped: int,
) -> dict[str, Any]:
    """validate.py's results row, in timm's column order (a multi-label split's: mAP and F1 for top-k)."""
    if result.multi_label:
        scores: dict[str, Any] = {
            "map": round(result.map, 4),
            "map_micro": round(result.map_micro, 4),
            "f1": round(result.f1, 4),
            "threshold": options.threshold,
        }
        return {"model": name, **scores, **pass_columns(checkpoint, runtime, model, result, skipped)}
    real = watchers.real
    top1, top5 = (real.accuracy(1), real.accuracy(5)) if real is not None else (result.top1, result.top5)
    counts = watchers.counts
    return {
        "model": name,
        "top1": round(top1, 4),
        "top1_err": round(100 - top1, 4),
        "top5": round(top5, 4),
        "top5_err": round(100 - top5, 4),
        **(counts.row(options.metrics_avg) if counts is not None and options.metrics_avg else {}),
        **pass_columns(checkpoint, runtime, model, result, skipped),
    }


def pass_columns(
    checkpoint: str, runtime: Runtime, model: EvalModel, result: EvalResult, skipped: int
) -> dict[str, Any]:
    """The row's columns after the scores: the model's size and preprocessing, the pass's loss, count and
    speed, and where it ran."""
    data_config = model.data_config
    return {
        "param_count": round(model.param_count / 1e6, 2) if model.param_count is not None else None,
        "img_size": data_config["input_size"][-1],
        "crop_pct": data_config["crop_pct"],
        "interpolation": data_config["interpolation"],
        "loss": round(result.loss, 6),
        "samples": result.count,
        "skipped": skipped,
        "device": str(runtime.device),
        "amp_dtype": runtime.amp.dtype_name,
        "channels_last": model.channels_last,
        "img_per_sec": round(result.images_per_second, 2),
        "checkpoint": checkpoint,
    }
