"""Top-k predictions of a timm model for a folder, glob, list file or single image, on any device.

Examples:
  python inference.py photos/ --model resnet50.a1_in1k --pretrained --topk 5 --label-type description
  python inference.py data/fashion-mnist-mini/val --model runs/fmnist/model --topk 3 --results-dir out
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from vtools.data.datasets import FileSamples, refuse_known_bad
from vtools.data.decode import bad_image_handler
from vtools.data.loaders import eval_device_loader
from vtools.data.memory_estimate import LoaderUse, check_host_memory
from vtools.data.readers.folder import find_image_entries, read_class_map
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.data.readers.scan import ImageEntries
from vtools.data.transforms import data_config_for, eval_transform, image_mode
from vtools.errors import UsageError
from vtools.evaluation.loops import predict
from vtools.evaluation.model_flags import add_eval_model_args, check_input_mode, ready_for_eval
from vtools.models.activation_memory import activation_bytes_per_image
from vtools.models.create import create_model, model_files, model_label
from vtools.models.folder import LABEL_TYPES, label_lookup
from vtools.models.prepare import use_channels_last
from vtools.observe.profiling import StepProfiler
from vtools.outputs import Output, check_outputs
from vtools.results import RESULT_FORMATS, format_table, write_rows
from vtools.runtime.distributed import refuse_torchrun
from vtools.runtime.resolve import setup_runtime

CONSOLE_ROWS = 50


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("data")
    add_data_source_args(group, "SOURCE", "a folder (searched recursively), a glob, a .txt file of paths, or one image")
    add_dataset_args(group)
    group.add_argument(
        "--split", default="validation", help="with --dataset: the split to classify (default: validation)"
    )
    add_model_args(parser)
    add_eval_model_args(parser, "inference")
    add_preprocess_args(parser)
    add_loader_args(parser, batch_size=256)
    add_device_args(parser)
    group = parser.add_argument_group("output")
    group.add_argument(
        "--topk", type=int, default=1, metavar="K", help="classes per image; 0 = every class (default: 1)"
    )
    group.add_argument(
        "--output-type",
        default="prob",
        choices=("prob", "logit"),
        help="softmax probabilities or raw logits (default: prob)",
    )
    group.add_argument(
        "--label-type",
        default="description",
        choices=LABEL_TYPES,
        help="labels to print: ImageNet synset name, description or detailed description for "
        "ImageNet models, the stored class names otherwise (default: description)",
    )
    group.add_argument("--include-index", action="store_true", default=False, help="include class indices")
    group.add_argument("--fullname", action="store_true", default=False, help="full paths instead of file names")
    group.add_argument(
        "--results-dir", default=None, metavar="DIR", help="folder for results files (default: the current folder)"
    )
    group.add_argument(
        "--results-file",
        default=None,
        metavar="NAME",
        help="results file name (default: <model>-topk<K>); one file per --results-format",
    )
    group.add_argument(
        "--results-format",
        nargs="+",
        default=["csv"],
        choices=RESULT_FORMATS,
        help="one or more of csv, json, jsonl (default: csv)",
    )
    group.add_argument(
        "--no-console-results", action="store_true", default=False, help="do not print the results table"
    )
    group.add_argument(
        "--results-separate-col",
        action="store_true",
        default=False,
        help="one column per rank (index_0, label_0, prob_0, ...) instead of a list per column, when K > 1",
    )
    group.add_argument(
        "--filename-col", default="filename", metavar="NAME", help="file name column (default: filename)"
    )
    group.add_argument("--index-col", default="index", metavar="NAME", help="class index column(s) (default: index)")
    group.add_argument("--label-col", default="label", metavar="NAME", help="label column(s) (default: label)")
    group.add_argument(
        "--output-col", default=None, metavar="NAME", help="score column(s) (default: the --output-type, prob or logit)"
    )
    group.add_argument(
        "--exclude-output",
        action="store_true",
        default=False,
        help="leave the scores out: only indices and labels (needs --topk 1 or more)",
    )
    return parser


def result_paths(args: argparse.Namespace) -> list[tuple[Path, str]]:
    """Where each requested format is written: always somewhere, as in timm's inference.py (by default
    <model>-topk<K>.<format> in the current folder), so predictions are never only on the console. A run's
    model folder is named after its run (runs/a/model: a-topk1.csv), so two runs' results never share a name."""
    name = args.results_file or f"{model_label(args.model)}-topk{args.topk}"
    base = Path(args.results_dir or ".") / name
    if base.suffix.lstrip(".") in RESULT_FORMATS:
        base = base.with_suffix("")
    return [(base.with_name(f"{base.name}.{fmt}"), fmt) for fmt in dict.fromkeys(args.results_format)]


def make_rows(
    args: argparse.Namespace, name_of: Callable[[int], str], outputs: list[tuple], labels: list[str] | None
) -> list[dict[str, Any]]:
    """One row per image, with timm's inference.py columns: the file name (--filename-col), then the
    top-k class indices (--index-col, with --include-index), labels (--label-col) and scores
    (--output-col; left out with --exclude-output); a scalar each when K = 1, a list each when K > 1,
    or one column per rank (``<col>_<i>``) with --results-separate-col. ``--topk 0`` gives every
    class's score: one column per class named ``<output col>:<class>``, or with --results-separate-col
    ``<output col>_<i>`` as timm's."""
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
                    row[column] = items[0] if len(items) == 1 else items
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
    root = Path(source)
    kept = ImageEntries()
    for index, path in enumerate(found.paths):
        if (path.parent.name if path.parent != root else "") in names:
            kept.add(path, found.unreadable.get(index))
    if not kept.paths:
        raise UsageError(
            f"--class-map {class_map_file}: none of the folders under {source} holding images is among its "
            f"{len(names)} classes"
        )
    return FileSamples(kept.paths, unreadable=kept.unreadable)


def check_paths(args: argparse.Namespace, source: str, results: list[Path]) -> None:
    """The results files (and the --profile trace) are apart from what this command reads, and their folder
    takes a file, before any model is built or image read."""
    inputs = [("SOURCE", source), ("--class-map", args.class_map), ("--checkpoint", args.checkpoint)]
    outputs = [Output("results file", path) for path in results]
    if args.profile:
        outputs.append(
            Output("--profile trace", StepProfiler.trace_path(Path(args.results_dir or "."), _profile_label(args)))
        )
    check_outputs([*inputs, *model_files(args.model)], outputs)


def _profile_label(args: argparse.Namespace) -> str:
    return f"inference-{model_label(args.model)}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    refuse_torchrun("inference.py")
    check_values(args)
    runtime = setup_runtime(args)
    source = args.data or args.data_dir
    if not source:
        raise UsageError("give the images to classify (SOURCE or --data-dir)")
    if not args.model:
        raise UsageError("--model is required (a timm name, hf-hub:..., or a model folder)")
    if args.topk < 0:
        raise UsageError(f"--topk must be 0 (every class) or positive, got {args.topk}")
    if args.exclude_output and args.topk == 0:
        raise UsageError("--exclude-output leaves only the top-k indices and labels: it needs --topk 1 or more")
    outputs_to = result_paths(args)
    check_paths(args, source, [path for path, _ in outputs_to])
    samples = (
        open_source(
            SourceRequest(args.dataset, source, args.split, args.dataset_download, args.input_key, args.target_key)
        ).samples
        if args.dataset
        else folder_images(source, args.class_map)
    )
    refuse_known_bad(samples, args.on_bad_image)
    model = create_model(
        args.model,
        pretrained=args.pretrained or not args.checkpoint,
        num_classes=args.num_classes,
        in_chans=model_in_chans(args),
        model_kwargs=timm_model_kwargs(args),
        checkpoint=args.checkpoint or None,
        use_ema=args.use_ema,
        device=runtime.device,
    )
    labels = label_lookup(model, args.label_type)
    data_config = data_config_for(model, preprocess_overrides(args))  # the train size, as timm's inference.py
    channels_last = use_channels_last(args.channels_last, model, runtime.device)
    check_host_memory(
        [LoaderUse("inference", data_config, samples)],
        args.batch_size,
        runtime.device,
        runtime.budget.workers,
        lambda: activation_bytes_per_image(model, data_config["input_size"], training=False),  # before compile
    )
    model = ready_for_eval(args, model, data_config, runtime.model_dtype, channels_last)  # --test-pool: crop 1.0
    mode = image_mode(data_config, args.input_img_mode)
    check_input_mode(mode, data_config)
    dataset = Source(samples, None, source).images(eval_transform(data_config), mode)
    skipped: list[str] = []
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
    profiler = StepProfiler(args.profile, runtime.device, Path(args.results_dir or "."), _profile_label(args))
    outputs = list(predict(model, profiler.wrap(loader), runtime.amp, args.topk, args.output_type))
    rows = make_rows(args, getattr(samples, "name", lambda i: f"{args.dataset}[{i}]"), outputs, labels)
    if not args.no_console_results and len(rows) <= CONSOLE_ROWS:
        print(format_table(rows))
    for path, fmt in outputs_to:
        write_rows(path, rows, fmt)
        print(f"results written to {path}")
    summary = f"{len(rows)} images classified on {runtime.device}"
    print(summary + (f", {len(skipped)} unreadable skipped" if skipped else ""))
    return 0
