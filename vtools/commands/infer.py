"""Top-k predictions of a timm model for a folder, glob, list file or single image, on any device.

Examples:
  python inference.py photos/ --model resnet50.a1_in1k --pretrained --topk 5 --label-type description
  python inference.py data/fashion-mnist-mini/val --model runs/fmnist/model --topk 3 --results-dir out
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vtools.cli.eval_flags import resolved_model_flags
from vtools.cli.infer_flags import build_parser as build_parser  # inference.py's parser, as tests reach it
from vtools.cli.typed import typed_options
from vtools.data.datasets import FileSamples, refuse_known_bad
from vtools.data.readers.folder import find_image_entries, read_class_map
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.data.readers.scan import EntryList
from vtools.errors import UsageError
from vtools.evaluation.assembly import EvalModel, EvalOptions
from vtools.evaluation.loops import predict
from vtools.evaluation.multilabel_eval import above_threshold
from vtools.models.create import is_multi_label_model, model_files, model_label
from vtools.models.folder import label_lookup
from vtools.observe.profiling import StepProfiler
from vtools.options.declare import ParsedOptions
from vtools.options.shared import SourceFlags
from vtools.outputs import Output, check_outputs
from vtools.results import RESULT_FORMATS, format_table, write_rows
from vtools.runtime.distributed import refuse_torchrun
from vtools.runtime.options import RuntimeOptions
from vtools.runtime.resolve import Runtime, setup_runtime

CONSOLE_ROWS = 50


def result_paths(args: ParsedOptions) -> list[tuple[Path, str]]:
    """Where each requested format is written: always somewhere, as in timm's inference.py (by default
    <model>-topk<K>.<format> in the current folder), so predictions are never only on the console. A run's
    model folder is named after its run (runs/a/model: a-topk1.csv), so two runs' results never share a name.
    A multi-label model's file says what chose its classes: <model>-threshold<T> (--topk does not)."""
    chosen = f"threshold{args.threshold:g}" if is_multi_label_model(args.model) else f"topk{args.topk}"
    name = args.results_file or f"{model_label(args.model)}-{chosen}"
    base = Path(args.results_dir or ".") / name
    if base.suffix.lstrip(".") in RESULT_FORMATS:
        base = base.with_suffix("")
    return [(base.with_name(f"{base.name}.{fmt}"), fmt) for fmt in dict.fromkeys(args.results_format)]


def make_rows(
    args: ParsedOptions,
    name_of: Callable[[int], str],
    outputs: list[tuple],
    labels: list[str] | None,
    always_lists: bool = False,
) -> list[dict[str, Any]]:
    """One row per image, with timm's inference.py columns: the file name (--filename-col), then the
    top-k class indices (--index-col, with --include-index), labels (--label-col) and scores
    (--output-col; left out with --exclude-output); a scalar each when K = 1, a list each when K > 1,
    or one column per rank (``<col>_<i>``) with --results-separate-col. ``--topk 0`` gives every
    class's score: one column per class named ``<output col>:<class>``, or with --results-separate-col
    ``<output col>_<i>`` as timm's. ``always_lists`` (a multi-label model's classes above --threshold,
    as many as there are) keeps a list even for one class."""
    output_col = args.output_col or args.output_type
    rows = []
    for indices, scores, classes in outputs:
        for row_index, dataset_index in enumerate(indices.tolist()):
            full = name_of(dataset_index)
            name = full if args.fullname else os.path.basename(full)
            # a name that is not UTF-8 (bytes Python keeps as surrogates) is written with escapes
            row: dict[str, Any] = {args.filename_col: name.encode("utf-8", "backslashreplace").decode("utf-8")}
            values = [round(v, 6) for v in scores[row_index].tolist()]
            separate = args.results_separate_col and len(values) > 1  # as timm: only when there is more than one
            if classes is None:  # --topk 0: the full vector
                if separate:
                    row.update({f"{output_col}_{i}": value for i, value in enumerate(values)})
                else:
                    names = labels or [str(i) for i in range(len(values))]
                    row.update({f"{output_col}:{name}": value for name, value in zip(names, values)})
                rows.append(row)
                continue
            top = classes[row_index].tolist()
            columns = []
            if args.include_index:
                columns.append((args.index_col, top))
            if labels is not None:
                columns.append((args.label_col, [labels[i] for i in top]))
            if not args.exclude_output:
                columns.append((output_col, values))
            for column, items in columns:
                if separate:
                    row.update({f"{column}_{i}": item for i, item in enumerate(items)})
                else:
                    row[column] = items[0] if len(items) == 1 and not always_lists else items
            rows.append(row)
    return rows


def folder_images(source: str, class_map_file: str) -> FileSamples:
    """The images of SOURCE (unreadable entries among them, with their reasons); with --class-map (as
    timm's folder reader) only those whose folder's name is in the map (an image directly in SOURCE has
    the name '')."""
    found = find_image_entries(source)
    if not class_map_file:
        return FileSamples(found.paths, unreadable=found.unreadable)
    if not Path(source).is_dir():
        raise UsageError(f"--class-map selects the class folders of a folder SOURCE; {source} is not a folder")
    names = read_class_map(class_map_file)
    kept = EntryList()
    for index, path in enumerate(found.paths):
        if os.path.basename(os.path.dirname(os.path.relpath(path, source))) in names:
            kept.add(path, found.unreadable.get(index))
    if not kept.names:
        raise UsageError(
            f"--class-map {class_map_file}: none of the folders under {source} holding images is among its "
            f"{len(names)} classes"
        )
    return FileSamples(kept.packed().paths, unreadable=kept.unreadable)


def check_paths(args: ParsedOptions, source: str, results: list[Path]) -> None:
    """The results files (and the --profile trace) are apart from what this command reads, and their folder
    takes a file, before any model is built or image read."""
    inputs = [("SOURCE", source), ("--class-map", args.class_map), ("--checkpoint", args.checkpoint)]
    outputs = [Output("results file", path) for path in results]
    if args.profile:
        outputs.append(
            Output("--profile trace", StepProfiler.trace_path(Path(args.results_dir or "."), _profile_label(args)))
        )
    check_outputs([*inputs, *model_files(args.model)], outputs)


def _profile_label(args: ParsedOptions) -> str:
    return f"inference-{model_label(args.model)}"


def inference_source(args: ParsedOptions, root: str) -> Source:
    """The images to classify: --dataset's split of ``root``, or the image files of SOURCE; under
    --on-bad-image error, refused first on entries known to be unreadable, before any model is built."""
    if args.dataset:
        source = open_source(SourceRequest.for_split(typed_options(SourceFlags, args), root, args.split))
    else:
        source = Source(folder_images(root, args.class_map), None, root)
    refuse_known_bad(source.samples, args.on_bad_image)
    return source


def inference_options(args: ParsedOptions) -> EvalOptions:
    """inference.py's options as the library takes them: the model's train size, as timm's inference.py;
    it has no --reparam or --crop-border-pixels."""
    resolved = resolved_model_flags(args)
    return typed_options(EvalOptions, args, **resolved, use_test_size=False, reparam=False, crop_border_pixels=None)


def classify(args: ParsedOptions, source: Source, runtime: Runtime) -> tuple[list[dict[str, Any]], list[str]]:
    """The results rows of every image of ``source``, and the unreadable images skipped."""
    options = inference_options(args)
    model = EvalModel.load(args.model, args.checkpoint or "", options, runtime)
    labels = label_lookup(model.module, args.label_type)
    model.ready(options, runtime)  # --test-pool: crop 1.0
    skipped: list[str] = []
    loader = model.loader(source, options, runtime, "inference", skipped)
    profiler = StepProfiler(args.profile, runtime.device, Path(args.results_dir or "."), _profile_label(args))
    multi_label = is_multi_label_model(args.model)
    topk = 0 if multi_label else args.topk  # a multi-label model's classes are chosen by --threshold
    outputs = list(
        predict(model.module, profiler.wrap(loader), runtime.amp, topk, args.output_type, multi_label=multi_label)
    )
    if multi_label and args.topk:
        print(f"multi-label model: each image lists every class with probability >= {args.threshold} (not the top-k)")
        outputs = list(above_threshold(outputs, args.threshold, args.output_type))
    return make_rows(args, source.samples.name, outputs, labels, always_lists=multi_label), skipped


def run(args: ParsedOptions) -> int:
    """Classify with the command line's options (vtools/cli/infer_flags.py parses them before torch loads)."""
    predict_rows(args)
    return 0


def predict_rows(args: ParsedOptions) -> list[dict[str, Any]]:
    """inference.py's whole run (printing, the results files): the prediction rows, one per image, as
    written to the results files."""
    refuse_torchrun("inference.py")
    runtime = setup_runtime(typed_options(RuntimeOptions, args))
    source = args.data or args.data_dir
    outputs_to = result_paths(args)
    check_paths(args, source, [path for path, _ in outputs_to])
    rows, skipped = classify(args, inference_source(args, source), runtime)
    if not args.no_console_results and len(rows) <= CONSOLE_ROWS:
        print(format_table(rows))
    for path, fmt in outputs_to:
        write_rows(path, rows, fmt)
        print(f"results written to {path}")
    summary = f"{len(rows)} images classified on {runtime.device}"
    print(summary + (f", {len(skipped)} unreadable skipped" if skipped else ""))
    return rows
