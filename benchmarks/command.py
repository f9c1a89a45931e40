"""``python3 -m benchmarks``: throughput of train / validate / inference, vtools against a plain baseline.

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
a plain timm-style loop (benchmarks/plain_loop.py) on the same timm flags, per
precision, alternating ``--repeats`` times, and reports the median wall time
and the final top-1 of each. The ``onepass`` task does the same for one epoch
over the whole folder with timm's default augmentation (every image decoded
once: the workload of an ImageNet epoch), against timm's own train.py when
``--timm-train`` names it, and measures the model alone over the same steps.

The ``loader`` task measures the loader ceiling: batches finished on the device
as fast as the host makes them, no model, through train.py's loaders and through
timm's ``create_loader``, for the training and the validation transforms, on
ImageNet-sized JPEGs (``--photos``) or on ``--data``.

The ``recovery`` task measures what recovery checkpoints cost a training step:
train.py's loop on one resident batch with none, with one every ``--recovery-every``
updates, and with those written to a throttled (slow) disk, alternated; and the
seconds of work a fault still loses (benchmarks/recovery.py).

The ``scale`` task measures how the class-folder reader's cost grows with the number of files, vtools'
against timm's ``ImageDataset``, on synthetic trees of ``--scale-sizes`` files: scan time, index
memory, a loader worker's private memory growth over an epoch, and train.py's and validate.py's
time and memory to their first batch (benchmarks/scale.py).

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

from benchmarks.measure import (
    MODES,
    PRECISIONS,
    SOURCES,
    TASKS,
    _convert_stores,
    _measurements,
    _run_one,
    add_ratios,
    measure,
    measure_onepass,
    measure_recipe,
)
from benchmarks.options import BenchOptions
from vtools.cli.typed import typed_options

ALL_TASKS = (*TASKS, "scale")  # scale: measured by the parent, its children started by benchmarks/scale.py


def build_parser() -> argparse.ArgumentParser:
    from vtools.cli.parser import OneLineParser

    parser = OneLineParser(
        prog="python3 -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_workload_flags(parser)
    _add_task_flags(parser)
    _add_scale_flags(parser)
    parser.add_argument("--output", default="", help="write the table here (.csv or .json)")
    parser.add_argument("--one", nargs=3, metavar=("TASK", "MODE", "SOURCE"), help=argparse.SUPPRESS)
    parser.add_argument("--stores", default="", help=argparse.SUPPRESS)  # converted copies, made by the parent
    return parser


def _add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """What is measured, and on what: model, data, tasks, sources, batch, device."""
    parser.add_argument("--model", default="resnet18", help="timm model (default: resnet18, 224 px)")
    parser.add_argument("--data", default="data/fashion-mnist-mini", help="image folder with train/ and val/")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(TASKS[:4]),
        choices=ALL_TASKS,
        help="(default: train validate inference recipe; recipe: whole train.py runs against a "
        "plain timm-style loop; onepass: one epoch over the whole folder against timm's way; loader: "
        "the loader ceiling, no model; decode: one core decoding, no model; recovery: step time with recovery "
        "checkpoints against none; scale: the folder reader's cost as the set grows, against timm's)",
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


def _add_task_flags(parser: argparse.ArgumentParser) -> None:
    """Settings of single tasks: the recipe runs, the one-pass reference, the loader's photo set."""
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
        help="recipe and onepass tasks: alternate the two runs N times and report the median; recovery: "
        "the stretches of --steps updates per way; scale: the alternations of the two readers and of the scripts "
        "per size (default: 1)",
    )
    parser.add_argument(
        "--timm-train",
        default="",
        metavar="PATH",
        help="onepass task: timm's own train.py (from a checkout of timm's scripts) as the reference; "
        "default: the plain timm-style loop",
    )
    parser.add_argument(
        "--recovery-every",
        type=int,
        default=50,
        metavar="N",
        help="recovery task: updates between recovery checkpoints (default: 50; --steps must be a multiple)",
    )
    parser.add_argument(
        "--recovery-slow-disk",
        type=float,
        default=10.0,
        metavar="MB_PER_S",
        help="recovery task: the speed of the throttled writer (the slow disk), MB/s (default: 10)",
    )
    parser.add_argument(
        "--photos",
        type=int,
        default=512,
        metavar="N",
        help="loader task: N ImageNet-sized JPEGs per split cut from the photos the installed scikit-learn "
        "and matplotlib wheels ship (default: 512); 0: the images of --data",
    )


def _add_scale_flags(parser: argparse.ArgumentParser) -> None:
    """The scale task's trees: their sizes, where they are kept, where the table and plot go."""
    parser.add_argument(
        "--scale-sizes",
        default="10000,100000,300000",
        metavar="N,N,...",
        help="scale task: the trees' file counts, comma-separated (default: 10000,100000,300000; ImageNet's "
        "training split is 1281167)",
    )
    parser.add_argument(
        "--scale-trees",
        default="/tmp/vtools-scale-trees",
        metavar="DIR",
        help="scale task: where the synthetic trees are kept between runs, made when missing (default: "
        "/tmp/vtools-scale-trees; 300 000 files take about 1.2 GB)",
    )
    parser.add_argument(
        "--scale-dir",
        default="runs/bench-scale",
        metavar="DIR",
        help="scale task: where scale.csv and scale.png are written (default: runs/bench-scale)",
    )


COLUMNS = [
    "task",
    "mode",
    "source",
    "img_per_sec",
    "data_wait",
    "vs_model",
    "vs_baseline",
    "wall_s",
    "wall_vs_baseline",
    "img_per_sec_per_core",
    "reference",
    "top1",
    "startup_s",
    "peak_host_mib",
    "peak_device_mib",
    "amp_dtype",
    "channels_last",
]

# the recovery task's own table: what the checkpoints cost per update, per checkpoint and per fault
RECOVERY_COLUMNS = [
    "task",
    "mode",
    "model",
    "batch_size",
    "img_size",
    "interval",
    "updates",
    "checkpoints",
    "step_ms",
    "overhead_pct",
    "cpu_cost_pct",
    "state_mb",
    "copy_s",
    "wait_s",
    "write_s",
    "write_cpu_s",
    "overhead_s_per_checkpoint",
    "disk_mbps",
    "lost_per_fault_s",
]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _check_args(args)
    options = typed_options(BenchOptions, args)
    if args.one:
        print(json.dumps(measure(*args.one, options)))
        return 0
    from vtools.outputs import Output, check_outputs
    from vtools.results import format_table, write_rows

    if args.output:
        check_outputs(
            [("--data", args.data), ("--timm-train", args.timm_train)], [Output("--output", Path(args.output))]
        )
    rows = _measure_all(args, options, argv)
    add_ratios(rows)
    others = [row for row in rows if row["task"] not in ("recovery", "scale")]
    recovery = [row for row in rows if row["task"] == "recovery"]  # its own figures: its own table
    scale = [row for row in rows if row["task"] == "scale"]  # and so are the scale task's
    if others or not (recovery or scale):
        print(format_table(others, COLUMNS))
    if recovery:
        print(format_table(recovery, RECOVERY_COLUMNS))
    if scale:
        from benchmarks.scale import COLUMNS as SCALE_COLUMNS
        from benchmarks.scale import write_scale

        print(format_table(scale, SCALE_COLUMNS))
        print(f"written to {', '.join(str(path) for path in write_scale(scale, Path(args.scale_dir)))}")
    if args.output:
        write_rows(args.output, rows, "json" if args.output.endswith(".json") else "csv")
        print(f"written to {args.output}")
    return 0


def _check_args(args: argparse.Namespace) -> None:
    from vtools.errors import UsageError

    if args.timm_train and not Path(args.timm_train).is_file():
        raise UsageError(f"--timm-train {args.timm_train}: no such file (timm's train.py from a checkout of timm)")
    for flag in ("steps", "batch_size", "recipe_epochs", "repeats"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be 1 or more, got {getattr(args, flag)}")
    if "recovery" in args.tasks:
        if args.recovery_every < 2:
            raise UsageError(f"--recovery-every must be 2 or more, got {args.recovery_every}")
        if args.steps % args.recovery_every:
            raise UsageError(
                f"--steps {args.steps} must be a multiple of --recovery-every {args.recovery_every} for the "
                "recovery task (each way trains whole intervals in turn)"
            )
        if args.recovery_slow_disk <= 0:
            raise UsageError(f"--recovery-slow-disk must be above 0 MB/s, got {args.recovery_slow_disk:g}")
    if "scale" in args.tasks:
        from benchmarks.scale import parse_sizes

        parse_sizes(args.scale_sizes)


def _measure_all(args: argparse.Namespace, options: BenchOptions, argv: list[str]) -> list[dict]:
    """Every measurement the flags ask for, each in its own process, over stores converted once; a line on
    stderr per measurement as it finishes."""
    import dataclasses
    import tempfile

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="vtools-bench-") as stores:
        _convert_stores(options, Path(stores))
        for task, mode, source in _measurements(dataclasses.replace(options, tasks=_child_tasks(options))):
            data = _photo_data(task, args, Path(stores))
            measured = _run_one(task, mode, source, [*argv, *data, "--stores", stores])
            for row in measured if isinstance(measured, list) else [measured]:
                rows.append(row)
                wait = row.get("data_wait")
                print(
                    f"{task:9s} {row['mode']:8s} {source:9s} {row['img_per_sec']:8.1f} img/s"
                    + (f"  data wait {100 * wait:5.1f} %" if wait is not None else ""),
                    file=sys.stderr,
                    flush=True,
                )
        if "recipe" in args.tasks:
            for precision in args.recipe_precisions:
                rows += measure_recipe(options, precision, Path(stores) / f"recipe-{precision}")
        if "onepass" in args.tasks:
            rows += measure_onepass(options, Path(stores) / "onepass", [*argv, "--stores", stores])
    if "scale" in args.tasks:
        from benchmarks.scale import measure_scale

        rows += measure_scale(options)
    return rows


def _child_tasks(options: BenchOptions) -> list[str]:
    """The tasks measure.py plans (the scale task plans its own processes)."""
    return [task for task in options.tasks if task != "scale"]


def _photo_data(task: str, args: argparse.Namespace, stores: Path) -> list[str]:
    """``--data`` for a loader measurement: the photo set, made once per bench run (``--photos``)."""
    if not task.startswith(("loader-", "host-")) or not args.photos:
        return []
    folder = stores / "photos"
    if not folder.exists():
        from benchmarks.photos import make_photo_set
        from vtools.errors import UsageError

        if not make_photo_set(folder, args.photos):
            raise UsageError("--photos: no photos found (install scikit-learn or matplotlib), or pass --photos 0")
    return ["--data", str(folder)]
