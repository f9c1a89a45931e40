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
a plain timm-style loop (vtools/plain_loop.py) on the same timm flags, per
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
import csv
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TASKS = ("train", "validate", "inference", "recipe", "decode")
PRECISIONS = ("float32", "bfloat16", "float16")
MODES = ("model", "vtools", "baseline")
SOURCES = ("folder", "wds", "parquet")
STORE_KINDS = {"wds": "wds/bench", "parquet": "hfds/bench"}


def build_parser() -> argparse.ArgumentParser:
    from vtools.cli import OneLineParser  # here, not at the top: the parent process stays light

    parser = OneLineParser(prog="python -m vtools bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="timm model (default: resnet18, 224 px)")
    parser.add_argument("--data", default="data/fashion-mnist-mini", help="image folder with train/ and val/")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS[:4]), choices=TASKS,
                        help="(default: train validate inference recipe; recipe: whole train.py runs against a "
                             "plain timm-style loop; decode: one core decoding, no model)")
    parser.add_argument("--sources", nargs="+", default=["folder"], choices=SOURCES,
                        help="where vtools reads the images from (default: folder)")
    parser.add_argument("--max-side", type=int, default=None, metavar="N",
                        help="decode task: also read shards storing the images with their longer side <= N")
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
    parser.add_argument("--recipe-epochs", type=int, default=8, metavar="N",
                        help="recipe task: epochs of each training run (default: 8)")
    parser.add_argument("--recipe-precisions", nargs="+", default=list(PRECISIONS[:2]), choices=PRECISIONS,
                        help="recipe task: one pair of runs per precision (default: float32 bfloat16)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="recipe task: alternate the two runs N times and report the median (default: 1)")
    parser.add_argument("--output", default="", help="write the table here (.csv or .json)")
    parser.add_argument("--one", nargs=3, metavar=("TASK", "MODE", "SOURCE"), help=argparse.SUPPRESS)
    parser.add_argument("--stores", default="", help=argparse.SUPPRESS)  # converted copies, made by the parent
    return parser


# ---------------------------------------------------------------- one measurement (runs in its own process)


class Timer:
    """Wall time of an iteration, and how much of it was spent waiting for the next batch."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.wait = 0.0
        self.images = 0

    def iterate(self, batches: Any, warmup: int, steps: int) -> Any:
        from vtools.device import synchronize

        iterator = iter(batches)
        for _ in range(warmup):
            yield next(iterator)
        synchronize(self.device)
        self.start = time.perf_counter()
        for _ in range(steps):
            before = time.perf_counter()
            batch = next(iterator)
            self.wait += time.perf_counter() - before
            yield batch
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.start


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included), on Linux."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def measure(task: str, mode: str, source: str, args: argparse.Namespace) -> dict[str, Any]:
    """One figure: the task's real loop (``train_one_epoch``, ``evaluate``, ``predict``) fed by vtools'
    loaders or by synthetic batches, or the plain baseline's own loop."""
    import timm
    import torch

    from vtools import device as dev
    from vtools.amp import resolve_amp
    from vtools.host import plan, setup_cpu_budget, usable_cores

    if task == "decode":
        return measure_decode(source, args)
    device = dev.resolve_device(args.device, args.device_modules)
    if mode == "baseline":  # the same worker count, none of vtools' thread or allocator settings
        budget = plan(device.type, len(usable_cores()), args.workers)
    else:
        budget = setup_cpu_budget(device, args.workers)
    amp = resolve_amp(device, args.amp, args.amp_dtype)
    model = timm.create_model(args.model, num_classes=10).to(device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    startup = process_age()
    timer = Timer(device)
    dev.reset_peak_memory(device)
    if mode == "baseline":
        step = _baseline_step(task, model, amp)
        for images, targets in timer.iterate(_baseline_batches(task, args, model, device, budget.workers),
                                             args.warmup, args.steps):
            step(images, targets)
    else:
        LOOPS[task](task, timer, mode, source, args, model, device, amp, budget.workers)
    images = args.steps * args.batch_size
    peak = dev.peak_memory_bytes(device)
    return {"task": task, "mode": mode, "source": source if mode == "vtools" else "folder", "model": args.model,
            "device": str(device), "amp_dtype": amp.dtype_name,
            "channels_last": args.channels_last, "batch_size": args.batch_size, "workers": budget.workers,
            "img_per_sec": round(images / timer.seconds, 2),
            "data_wait": round(timer.wait / timer.seconds, 4), "startup_s": round(startup, 2),
            "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "peak_device_mib": round(peak / 2**20, 1) if peak is not None else None}


class Timed:
    """The timer's batches with a length, as the real loops (progress bars, accumulation) expect."""

    def __init__(self, timer: Timer, batches: Any, args: argparse.Namespace) -> None:
        self.batches = timer.iterate(batches, args.warmup, args.steps)
        self.length = args.warmup + args.steps

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Any:
        return iter(self.batches)


def _train_loop(task: str, timer: Timer, mode: str, source: str, args: argparse.Namespace, model: Any, device: Any,
                amp: Any, workers: int) -> None:
    """train.py's own loaders and components (optimizer, schedule, loss, AMP) and its train_one_epoch."""
    from vtools.commands import train as train_command
    from vtools.distributed import DistInfo
    from vtools.training import train_one_epoch

    flags = [*_source_flags(source, args), "--model", args.model, "--batch-size", str(args.batch_size),
             "--warmup-epochs", "0", "--channels-last" if args.channels_last else "--no-channels-last"]
    train_args = train_command.build_parser().parse_args(flags)
    train_args.data_dir = train_args.data or train_args.data_dir
    train_source, val_source, classes = train_command.build_datasets(train_args)
    loaders = train_command.build_loaders(train_args, model, train_source, val_source, device, DistInfo(), workers)
    parts, _, _ = train_command.build_components(train_args, model, loaders, 10, device, amp, DistInfo())
    batches = _synthetic(args, model, device) if mode == "model" else _epochs(loaders.train)
    train_one_epoch(parts, Timed(timer, batches, args), epoch=0, num_updates=0,
                    log_interval=args.warmup + args.steps, show_progress=False)


def _eval_loop(task: str, timer: Timer, mode: str, source: str, args: argparse.Namespace, model: Any, device: Any,
               amp: Any, workers: int) -> None:
    """validate.py's loader and its evaluate(), or inference.py's predict()."""
    from vtools import data as vdata
    from vtools.engine import evaluate, predict

    if mode == "model":
        batches = _synthetic(args, model, device)
    else:
        config = vdata.data_config_for(model, {})
        dataset = _open(source, "validation", args).images(vdata.eval_transform(config), "RGB")
        batches = _epochs(vdata.eval_device_loader(dataset, args.batch_size, device, workers, config,
                                                   args.channels_last, None, persistent=True))
    if task == "validate":
        evaluate(model, Timed(timer, batches, args), device, amp, show_progress=False)
    else:
        for _ in predict(model, Timed(timer, batches, args), amp, topk=5, show_progress=False):
            pass


def measure_decode(source: str, args: argparse.Namespace) -> dict[str, Any]:
    """One core decoding and eval-transforming images (no model, no workers): what a loader worker does."""
    import timm

    from vtools import data as vdata

    config = vdata.data_config_for(timm.create_model(args.model, num_classes=10), {})
    dataset = _open(source, "train", args).images(vdata.eval_transform(config), "RGB")
    count = min(len(dataset), args.steps * args.batch_size)
    for index in range(min(args.warmup, count)):
        dataset[index]
    start = time.perf_counter()
    for index in range(count):
        dataset[index]
    seconds = time.perf_counter() - start
    return {"task": "decode", "mode": "vtools", "source": source, "model": args.model, "device": "cpu",
            "img_per_sec": round(count / seconds, 2), "startup_s": round(process_age(), 2),
            "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _open(source: str, split: str, args: argparse.Namespace) -> Any:
    """The bench images from the folder or from one of the copies the parent converted."""
    from vtools.sources import SourceRequest, open_source

    if source == "folder":
        return open_source(SourceRequest("", args.data, split))
    kind = "wds" if source.startswith("wds") else "parquet"
    return open_source(SourceRequest(STORE_KINDS[kind], str(Path(args.stores) / source), split))


def _source_flags(source: str, args: argparse.Namespace) -> list[str]:
    """train.py's flags for the bench images in the folder or one of the converted copies."""
    if source == "folder":
        return [args.data]
    kind = "wds" if source.startswith("wds") else "parquet"
    return ["--dataset", STORE_KINDS[kind], "--data-dir", str(Path(args.stores) / source)]


def _synthetic(args: argparse.Namespace, model: Any, device: Any) -> Any:
    """The same random batch forever, already on the device: the model alone."""
    import torch

    from vtools.data import Batch

    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    images = torch.randn(args.batch_size, *size, device=device)
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    batch = Batch(images, torch.randint(0, 10, (args.batch_size,), device=device), torch.arange(args.batch_size))
    return iter(lambda: batch, None)


def _epochs(loader: Any) -> Any:
    """A loader's batches, epoch after epoch (a sampler with epochs gets the next one each time)."""
    sampler = getattr(getattr(loader, "loader", None), "sampler", None)
    epoch = 0
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _baseline_step(task: str, model: Any, amp: Any) -> Any:
    """What a user writes without vtools: a plain SGD step, or a forward pass (+ top-5 for inference)."""
    import torch
    import torch.nn.functional as F

    if task == "train":
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        scaler = amp.grad_scaler()

        def train_step(images: torch.Tensor, targets: torch.Tensor) -> None:
            with amp.autocast():
                loss = F.cross_entropy(model(images), targets)
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return train_step
    model.eval()

    @torch.inference_mode()
    def eval_step(images: torch.Tensor, targets: torch.Tensor) -> None:
        with amp.autocast():
            logits = model(images)
        if task == "inference":
            logits.float().softmax(1).topk(5)

    return eval_step


def _baseline_batches(task: str, args: argparse.Namespace, model: Any, device: Any, workers: int) -> Any:
    """ImageFolder + timm transform (normalizing in the workers) + DataLoader, .to(device) per batch."""
    import torch
    import torchvision
    from timm.data import create_transform, resolve_data_config

    from vtools.data import resolve_split_dir

    config = resolve_data_config(model=model)
    transform = create_transform(**config, is_training=task == "train")
    root = resolve_split_dir(args.data, "train" if task == "train" else "validation")
    dataset = torchvision.datasets.ImageFolder(str(root), transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=task == "train",
                                         num_workers=workers, drop_last=task == "train",
                                         persistent_workers=workers > 0)
    for images, targets in _epochs(loader):
        images = images.to(device)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        yield images, targets.to(device)


LOOPS = {"train": _train_loop, "validate": _eval_loop, "inference": _eval_loop}


# ---------------------------------------------------------------- the recipe: whole training runs

# timm flags for a short from-scratch run at 32 px; --model, --epochs, --device and the precision flags
# come from the bench's own options
RECIPE_FLAGS = ("--img-size", "32", "--crop-pct", "1.0", "--batch-size", "128", "--opt", "sgd", "--lr", "0.1",
                "--weight-decay", "5e-4", "--sched", "cosine", "--warmup-epochs", "1", "--smoothing", "0.1",
                "--scale", "0.7", "1.0", "--ratio", "0.9", "1.1", "--color-jitter", "0",
                "--train-interpolation", "bilinear", "--interpolation", "bilinear", "--seed", "42")


def recipe_flags(args: argparse.Namespace, precision: str) -> list[str]:
    """The command line both runs get (timm's flag names, so the baseline parses them too)."""
    flags = [*RECIPE_FLAGS, "--model", args.model, "--epochs", str(args.recipe_epochs), "--device", args.device]
    if precision != "float32":
        flags += ["--amp", "--amp-dtype", precision]
    if args.channels_last:
        flags.append("--channels-last")
    if args.workers is not None:
        flags += ["--workers", str(args.workers)]
    return flags


def measure_recipe(args: argparse.Namespace, precision: str, folder: Path) -> list[dict[str, Any]]:
    """Wall time (start-up included, from launch to exit) and final top-1 of train.py and of the plain
    loop on the same command line, alternating ``--repeats`` times; each row holds the median.

    Each run's folder is read and deleted before the next run starts, so every run writes its
    checkpoints into the same state of the disk cache instead of after the gigabytes of earlier runs.
    """
    flags = recipe_flags(args, precision)
    commands = {
        "vtools": [sys.executable, "-m", "vtools", "train", args.data, *flags, "--output", str(folder),
                   "--experiment", "vtools"],
        "baseline": [sys.executable, "-m", "vtools.plain_loop", "--data-dir", args.data, *flags,
                     "--output", str(folder / "baseline")],
    }
    walls: dict[str, list[float]] = {"vtools": [], "baseline": []}
    top1: dict[str, float] = {}
    for repeat in range(args.repeats):
        for mode, command in commands.items():
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True)
            walls[mode].append(time.perf_counter() - start)
            if proc.returncode != 0:
                from vtools.errors import UsageError

                raise UsageError(f"benchmark recipe/{mode} failed: {proc.stderr.strip().splitlines()[-1]}")
            top1[mode] = _final_top1(folder / mode, mode)
            shutil.rmtree(folder / mode)
            print(f"recipe    {mode:8s} {precision:9s} run {repeat + 1}: {walls[mode][-1]:6.1f} s", file=sys.stderr,
                  flush=True)
    images = _train_images(args.data) * args.recipe_epochs
    rows = []
    for mode, times in walls.items():
        wall = statistics.median(times)
        rows.append({"task": "recipe", "mode": mode, "source": "folder", "model": args.model,
                     "amp_dtype": precision, "channels_last": args.channels_last,
                     "batch_size": 128, "epochs": args.recipe_epochs, "wall_s": round(wall, 2),
                     "walls_s": " ".join(f"{t:.1f}" for t in times), "img_per_sec": round(images / wall, 2),
                     "top1": top1[mode]})
    return rows


def _train_images(data: str) -> int:
    from vtools.data import find_images, resolve_split_dir

    return len(find_images(str(resolve_split_dir(data, "train"))))


def _final_top1(run: Path, mode: str) -> float:
    """The last epoch's top-1 of a run: train.py's summary.csv, the plain loop's summary.json."""
    if mode == "vtools":
        with open(run / "summary.csv", encoding="utf-8") as handle:
            return round(float(list(csv.DictReader(handle))[-1]["eval_top1"]), 2)
    rows = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    return round(rows[-1]["top1"], 2)


# ---------------------------------------------------------------- the driver


def _run_one(task: str, mode: str, source: str, argv: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "vtools", "bench", *argv, "--one", task, mode, source]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        from vtools.errors import UsageError

        raise UsageError(f"benchmark {task}/{mode}/{source} failed: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measurements(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(task, mode, source) in the order they run."""
    plan = []
    for task in args.tasks:
        if task == "recipe":  # whole runs, measured by the parent: measure_recipe
            continue
        if task == "decode":
            plan += [(task, "vtools", "folder")] + ([(task, "vtools", f"wds-max{args.max_side}")]
                                                    if args.max_side else [])
            continue
        for mode in args.modes:
            plan += [(task, mode, source) for source in (args.sources if mode == "vtools" else ["folder"])]
    return plan


def _convert_stores(args: argparse.Namespace, folder: Path) -> None:
    """The bench images as shards and parquet (and pre-resized shards), once for every measurement."""
    from vtools.shards import convert

    wanted = [s for s in args.sources if s != "folder"] if set(args.tasks) - {"decode"} else []
    if "decode" in args.tasks and args.max_side:
        wanted.append(f"wds-max{args.max_side}")
    for store in wanted:
        fmt = "parquet" if store == "parquet" else "wds"
        convert(Path(args.data), folder / store, "bench", fmt, max_side=args.max_side if "max" in store else None)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """vtools relative to the model alone and to the baseline, per task and precision (throughput ratios:
    above 1 is faster; for whole runs also the wall-time ratio: below 1 is faster)."""
    by_key = {(row["task"], row.get("amp_dtype"), row["mode"]): row for row in rows}
    for row in rows:
        if row["mode"] != "vtools":
            continue
        model = by_key.get((row["task"], row.get("amp_dtype"), "model"))
        baseline = by_key.get((row["task"], row.get("amp_dtype"), "baseline"))
        if model:
            row["vs_model"] = round(row["img_per_sec"] / model["img_per_sec"], 3)
        if baseline:
            row["vs_baseline"] = round(row["img_per_sec"] / baseline["img_per_sec"], 3)
        if baseline and "wall_s" in row:
            row["wall_vs_baseline"] = round(row["wall_s"] / baseline["wall_s"], 3)


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

    from vtools.files import check_writable, format_table, write_rows

    if args.output:
        check_writable(args.output, "--output")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vtools-bench-") as stores:
        _convert_stores(args, Path(stores))
        for task, mode, source in _measurements(args):
            rows.append(_run_one(task, mode, source, [*argv, "--stores", stores]))
            wait = rows[-1].get("data_wait")
            print(f"{task:9s} {mode:8s} {source:9s} {rows[-1]['img_per_sec']:8.1f} img/s"
                  + (f"  data wait {100 * wait:5.1f} %" if wait is not None else ""), file=sys.stderr, flush=True)
        if "recipe" in args.tasks:
            for precision in args.recipe_precisions:
                rows += measure_recipe(args, precision, Path(stores) / f"recipe-{precision}")
    add_ratios(rows)
    print(format_table(rows, ["task", "mode", "source", "img_per_sec", "data_wait", "vs_model", "vs_baseline",
                              "wall_s", "wall_vs_baseline", "top1", "startup_s", "peak_host_mib",
                              "peak_device_mib", "amp_dtype", "channels_last"]))
    if args.output:
        write_rows(args.output, rows, "json" if args.output.endswith(".json") else "csv")
        print(f"written to {args.output}")
    return 0
