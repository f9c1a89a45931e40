"""``python -m vtools bench``: throughput of train / validate / inference, vtools against a plain baseline.

For each task it measures, each in a fresh process (so start-up and peak
memory belong to that measurement alone), the loop the scripts run: train.py's
``train_one_epoch`` with train.py's own loaders and components, validate.py's
``evaluate``, inference.py's ``predict``, in three modes:

- ``model``: that loop on one synthetic batch already on the device;
- ``vtools``: end to end on a real image folder through vtools' loaders
  (uint8 batches, device-side normalization, prefetching);
- ``baseline``: the same work written plainly: a timm model, torchvision's
  ImageFolder and DataLoader, timm's transforms normalizing in the workers.

The ``recipe`` task runs whole trainings (start-up to exit) of train.py and of
a plain timm-style loop (vtools/bench/plain_loop.py) on the same timm flags, per
precision, alternating ``--repeats`` times, and reports the median wall time
and the final top-1 of each.

``--sources`` runs the ``vtools`` mode on the same images stored as a folder,
as tar shards (``wds``) and as parquet (``parquet``), converted once for the
run. The ``decode`` task measures one core decoding and transforming images
with no model, from the folder and, with ``--max-side N``, from shards that
store them pre-resized.

It reports img/s, the fraction of time spent waiting for data, start-up
seconds (imports + model creation), and peak host and device memory, as a
table and as a csv/json file. Speed is measured here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vtools.bench.measure import (
    MODES,
    PRECISIONS,
    SOURCES,
    TASKS,
    _convert_stores,
    _measurements,
    _run_one,
    add_ratios,
    measure,
    measure_recipe,
)


def build_parser() -> argparse.ArgumentParser:
    from vtools.cli.parser import OneLineParser

    parser = OneLineParser(
        prog="python -m vtools bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet18", help="timm model (default: resnet18, 224 px)")
    parser.add_argument("--data", default="data/fashion-mnist-mini", help="image folder with train/ and val/")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(TASKS[:4]),
        choices=TASKS,
        help="(default: train validate inference recipe; recipe: whole train.py runs against a "
        "plain timm-style loop; decode: one core decoding, no model)",
    )
    parser.add_argument(
        "--sources",
        nargs="+",
        default=["folder"],
        choices=SOURCES,
        help="where vtools reads the images from (default: folder)",
    )
    parser.add_argument(
        "--max-side",
        type=int,
        default=None,
        metavar="N",
        help="decode task: also read shards storing the images with their longer side <= N",
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12, help="timed batches per measurement")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--workers", type=int, default=None, help="loader processes (default: vtools' default)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--device-modules", nargs="*", default=[])
    parser.add_argument("--amp", action="store_true", default=False)
    parser.add_argument("--amp-dtype", default="auto", choices=("auto", "bfloat16", "float16"))
    parser.add_argument("--channels-last", action="store_true", default=False)
    parser.add_argument(
        "--recipe-epochs",
        type=int,
        default=8,
        metavar="N",
        help="recipe task: epochs of each training run (default: 8)",
    )
    parser.add_argument(
        "--recipe-precisions",
        nargs="+",
        default=list(PRECISIONS[:2]),
        choices=PRECISIONS,
        help="recipe task: one pair of runs per precision (default: float32 bfloat16)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="recipe task: alternate the two runs N times and report the median (default: 1)",
    )
    parser.add_argument("--output", default="", help="write the table here (.csv or .json)")
    parser.add_argument("--one", nargs=3, metavar=("TASK", "MODE", "SOURCE"), help=argparse.SUPPRESS)
    parser.add_argument("--stores", default="", help=argparse.SUPPRESS)  # converted copies, made by the parent
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    for flag in ("steps", "batch_size", "recipe_epochs", "repeats"):
        if getattr(args, flag) < 1:
            from vtools.errors import UsageError

            raise UsageError(f"--{flag.replace('_', '-')} must be 1 or more, got {getattr(args, flag)}")
    if args.one:
        print(json.dumps(measure(*args.one, args)))
        return 0
    import tempfile

    from vtools.atomic import check_writable
    from vtools.results import format_table, write_rows

    if args.output:
        check_writable(args.output, "--output")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vtools-bench-") as stores:
        _convert_stores(args, Path(stores))
        for task, mode, source in _measurements(args):
            rows.append(_run_one(task, mode, source, [*argv, "--stores", stores]))
            wait = rows[-1].get("data_wait")
            print(
                f"{task:9s} {mode:8s} {source:9s} {rows[-1]['img_per_sec']:8.1f} img/s"
                + (f"  data wait {100 * wait:5.1f} %" if wait is not None else ""),
                file=sys.stderr,
                flush=True,
            )
        if "recipe" in args.tasks:
            for precision in args.recipe_precisions:
                rows += measure_recipe(args, precision, Path(stores) / f"recipe-{precision}")
    add_ratios(rows)
    print(
        format_table(
            rows,
            [
                "task",
                "mode",
                "source",
                "img_per_sec",
                "data_wait",
                "vs_model",
                "vs_baseline",
                "wall_s",
                "wall_vs_baseline",
                "top1",
                "startup_s",
                "peak_host_mib",
                "peak_device_mib",
                "amp_dtype",
                "channels_last",
            ],
        )
    )
    if args.output:
        write_rows(args.output, rows, "json" if args.output.endswith(".json") else "csv")
        print(f"written to {args.output}")
    return 0
