"""Throughput measurement: each loop the scripts run, timed in a fresh process.

``python3 -m benchmarks`` (``benchmarks.command``) calls :func:`measure` once per task,
mode and source in a child process, so start-up and peak memory belong to that
measurement alone; the plain baseline it compares with is ``benchmarks.plain_loop``.
"""

from __future__ import annotations

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

from benchmarks.onepass import SCHEDULE_FLAGS
from benchmarks.options import BenchOptions
from benchmarks.plain_loop import baseline_batches, baseline_step, epochs_of

TASKS = ("train", "validate", "inference", "recipe", "decode", "onepass", "loader", "recovery")


PRECISIONS = ("float32", "bfloat16", "float16")


MODES = ("model", "vtools", "baseline")


SOURCES = ("folder", "wds", "parquet")


STORE_KINDS = {"wds": "wds/bench", "parquet": "hfds/bench"}


class Timer:
    """Wall time of an iteration, and how much of it was spent waiting for the next batch."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.wait = 0.0
        self.images = 0

    def iterate(self, batches: Any, warmup: int, steps: int) -> Any:
        from vtools.runtime.device import synchronize

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


def measure(task: str, mode: str, source: str, options: BenchOptions) -> dict[str, Any] | list[dict[str, Any]]:
    """One figure: the task's real loop (``train_one_epoch``, ``evaluate``, ``predict``) fed by vtools'
    loaders or by synthetic batches, or the plain baseline's own loop."""
    import timm
    import torch

    from vtools.runtime import device as dev
    from vtools.runtime.amp import resolve_amp
    from vtools.runtime.cpu_budget import plan, setup_cpu_budget, usable_cores

    if task == "decode":
        return measure_decode(source, options)
    if task == "onepass":
        from benchmarks.onepass import measure_model_epoch

        return measure_model_epoch(options)
    if task == "recovery":  # the three ways in one process, alternated: a list of three rows
        from benchmarks.recovery import measure_recovery

        return measure_recovery(options, process_age)
    if task == "host-train":  # both loaders in one process, alternated: a list of two rows
        from benchmarks.loader_ceiling import measure_host_items

        return measure_host_items(options)
    if task.startswith("loader-"):
        from benchmarks.loader_ceiling import measure_loader

        return measure_loader(mode, task.removeprefix("loader-"), options)
    device = dev.resolve_device(options.device, options.device_modules or ())
    if mode == "baseline":  # the same worker count, none of vtools' thread or allocator settings
        budget = plan(device.type, len(usable_cores()), options.workers)
    else:
        budget = setup_cpu_budget(device, options.workers)
    amp = resolve_amp(device, options.amp, options.amp_dtype)
    model = timm.create_model(options.model, num_classes=10).to(device)
    if options.channels_last:
        model.to(memory_format=torch.channels_last)
    startup = process_age()
    timer = Timer(device)
    dev.reset_peak_memory(device)
    if mode == "baseline":
        step = baseline_step(task, model, amp)
        for images, targets in timer.iterate(
            baseline_batches(task, options, model, device, budget.workers), options.warmup, options.steps
        ):
            step(images, targets)
    else:
        LOOPS[task](task, timer, mode, source, options, model, device, amp, budget.workers)
    images = options.steps * options.batch_size
    peak = dev.peak_memory_bytes(device)
    return {
        "task": task,
        "mode": mode,
        "source": source if mode == "vtools" else "folder",
        "model": options.model,
        "device": str(device),
        "amp_dtype": amp.dtype_name,
        "channels_last": options.channels_last,
        "batch_size": options.batch_size,
        "workers": budget.workers,
        "img_per_sec": round(images / timer.seconds, 2),
        "data_wait": round(timer.wait / timer.seconds, 4),
        "startup_s": round(startup, 2),
        "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_device_mib": round(peak / 2**20, 1) if peak is not None else None,
    }


class Timed:
    """The timer's batches with a length, as the real loops (progress bars, accumulation) expect."""

    def __init__(self, timer: Timer, batches: Any, options: BenchOptions) -> None:
        self.batches = timer.iterate(batches, options.warmup, options.steps)
        self.length = options.warmup + options.steps

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Any:
        return iter(self.batches)


def _train_loop(
    task: str,
    timer: Timer,
    mode: str,
    source: str,
    options: BenchOptions,
    model: Any,
    device: Any,
    amp: Any,
    workers: int,
) -> None:
    """train.py's own loaders and components (optimizer, schedule, loss, AMP) and its train_one_epoch."""
    from benchmarks.options import train_job
    from vtools.runtime.distributed import DistInfo
    from vtools.train import assemble
    from vtools.train.loop import train_one_epoch

    flags = [
        *_source_flags(source, options),
        "--model",
        options.model,
        "--batch-size",
        str(options.batch_size),
        "--warmup-epochs",
        "0",
        "--channels-last" if options.channels_last else "--no-channels-last",
    ]
    job = train_job(flags)
    train_source, val_source, classes = assemble.build_datasets(job.data)
    loaders = assemble.build_loaders(job, model, train_source, val_source, device, DistInfo(), workers)
    parts, _, _ = assemble.build_components(job, model, loaders, 10, device, amp, DistInfo())
    batches = _synthetic(options, model, device) if mode == "model" else epochs_of(loaders.train)
    train_one_epoch(
        parts,
        Timed(timer, batches, options),
        epoch=0,
        num_updates=0,
        log_interval=options.warmup + options.steps,
        show_progress=False,
    )


def _eval_loop(
    task: str,
    timer: Timer,
    mode: str,
    source: str,
    options: BenchOptions,
    model: Any,
    device: Any,
    amp: Any,
    workers: int,
) -> None:
    """validate.py's loader and its evaluate(), or inference.py's predict()."""
    from vtools.data.loaders import eval_device_loader
    from vtools.data.transforms import data_config_for, eval_transform
    from vtools.evaluation.loops import evaluate, predict

    if mode == "model":
        batches = _synthetic(options, model, device)
    else:
        config = data_config_for(model, {})
        dataset = _open(source, "validation", options).images(eval_transform(config), "RGB")
        batches = epochs_of(
            eval_device_loader(
                dataset, options.batch_size, device, workers, config, options.channels_last, None, persistent=True
            )
        )
    if task == "validate":
        evaluate(model, Timed(timer, batches, options), device, amp, show_progress=False)
    else:
        for _ in predict(model, Timed(timer, batches, options), amp, topk=5, show_progress=False):
            pass


def measure_decode(source: str, options: BenchOptions) -> dict[str, Any]:
    """One core decoding and eval-transforming images (no model, no workers): what a loader worker does."""
    import timm

    from vtools.data.transforms import data_config_for, eval_transform

    config = data_config_for(timm.create_model(options.model, num_classes=10), {})
    dataset = _open(source, "train", options).images(eval_transform(config), "RGB")
    count = min(len(dataset), options.steps * options.batch_size)
    for index in range(min(options.warmup, count)):
        dataset[index]
    start = time.perf_counter()
    for index in range(count):
        dataset[index]
    seconds = time.perf_counter() - start
    return {
        "task": "decode",
        "mode": "vtools",
        "source": source,
        "model": options.model,
        "device": "cpu",
        "img_per_sec": round(count / seconds, 2),
        "startup_s": round(process_age(), 2),
        "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _open(source: str, split: str, options: BenchOptions) -> Any:
    """The bench images from the folder or from one of the copies the parent converted."""
    from vtools.data.readers.registry import SourceRequest, open_source

    if source == "folder":
        return open_source(SourceRequest("", options.data, split))
    kind = "wds" if source.startswith("wds") else "parquet"
    return open_source(SourceRequest(STORE_KINDS[kind], str(Path(options.stores) / source), split))


def _source_flags(source: str, options: BenchOptions) -> list[str]:
    """train.py's flags for the bench images in the folder or one of the converted copies."""
    if source == "folder":
        return [options.data]
    kind = "wds" if source.startswith("wds") else "parquet"
    return ["--dataset", STORE_KINDS[kind], "--data-dir", str(Path(options.stores) / source)]


def _synthetic(options: BenchOptions, model: Any, device: Any) -> Any:
    """The same random batch forever, already on the device: the model alone."""
    import torch

    from vtools.data.loaders import Batch

    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    images = torch.randn(options.batch_size, *size, device=device)
    if options.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    batch = Batch(images, torch.randint(0, 10, (options.batch_size,), device=device), torch.arange(options.batch_size))
    return iter(lambda: batch, None)


LOOPS = {"train": _train_loop, "validate": _eval_loop, "inference": _eval_loop}


# timm flags for a short from-scratch run at 32 px; --model, --epochs, --device and the precision flags
# come from the bench's own options
RECIPE_FLAGS = (
    *SCHEDULE_FLAGS,
    *("--warmup-epochs", "1", "--scale", "0.7", "1.0", "--ratio", "0.9", "1.1", "--color-jitter", "0"),
    *("--train-interpolation", "bilinear", "--interpolation", "bilinear"),
)


def recipe_flags(options: BenchOptions, precision: str) -> list[str]:
    """The command line both runs get (timm's flag names, so the baseline parses them too)."""
    flags = [
        *RECIPE_FLAGS,
        "--model",
        options.model,
        "--epochs",
        str(options.recipe_epochs),
        "--device",
        options.device,
    ]
    if precision != "float32":
        flags += ["--amp", "--amp-dtype", precision]
    if options.channels_last:
        flags.append("--channels-last")
    if options.workers is not None:
        flags += ["--workers", str(options.workers)]
    return flags


def measure_recipe(options: BenchOptions, precision: str, folder: Path) -> list[dict[str, Any]]:
    """train.py against the plain loop on the recipe's command line (:func:`whole_runs`)."""
    flags = recipe_flags(options, precision)
    commands = {
        "vtools": [sys.executable, "-m", "vtools", "train", options.data, *flags, "--output", str(folder)],
        "baseline": [sys.executable, "-m", "benchmarks.plain_loop", "--data-dir", options.data, *flags],
    }
    row = {"task": "recipe", "amp_dtype": precision, "epochs": options.recipe_epochs, "reference": "plain loop"}
    return whole_runs(options, commands, folder, _train_images(options.data) * options.recipe_epochs, row)


def measure_onepass(options: BenchOptions, folder: Path, argv: list[str]) -> list[dict[str, Any]]:
    """The model alone over one epoch's steps (a child process), then train.py against timm's way on one
    pass over the folder (:mod:`benchmarks.onepass`)."""
    from benchmarks.onepass import run_commands, split_counts

    model = _run_one("onepass", "model", "folder", argv)
    model["amp_dtype"] = "float32"
    train_images, val_images = split_counts(options.data)
    images = train_images // 128 * 128 + val_images
    reference = "timm train.py" if options.timm_train else "plain loop"
    # each script lays out the model by its own default (vtools: by its rule; timm's: NCHW)
    row = {"task": "onepass", "amp_dtype": "float32", "epochs": 1, "reference": reference, "channels_last": None}
    return [model, *whole_runs(options, run_commands(options, folder), folder, images, row)]


def whole_runs(
    options: BenchOptions, commands: dict[str, list[str]], folder: Path, images: int, row: dict[str, Any]
) -> list[dict[str, Any]]:
    """Wall time (start-up included, from launch to exit) and final top-1 of each command (each writes
    ``folder/<mode>``: ``--experiment <mode>``, or ``--output`` for the plain loop), alternating
    ``--repeats`` times; each row holds the median and ``images`` over it.

    Each run's folder is read and deleted before the next run starts, so every run writes its
    checkpoints into the same state of the disk cache instead of after the gigabytes of earlier runs.
    """
    walls: dict[str, list[float]] = {mode: [] for mode in commands}
    top1: dict[str, float] = {}
    for repeat in range(options.repeats):
        for mode, command in commands.items():
            if "benchmarks.plain_loop" in command:
                command = [*command, "--output", str(folder / mode)]
            else:
                command = [*command, "--experiment", mode]
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True)
            walls[mode].append(time.perf_counter() - start)
            if proc.returncode != 0:
                from vtools.errors import UsageError

                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise UsageError(f"benchmark {row['task']}/{mode} failed: {last}")
            top1[mode] = _final_top1(folder / mode)
            shutil.rmtree(folder / mode)
            print(
                f"{row['task']:9s} {mode:8s} {row['amp_dtype']:9s} run {repeat + 1}: {walls[mode][-1]:6.1f} s",
                file=sys.stderr,
                flush=True,
            )
    rows = []
    for mode, times in walls.items():
        wall = statistics.median(times)
        rows.append(
            {
                "channels_last": options.channels_last,
                **row,
                "mode": mode,
                "source": "folder",
                "model": options.model,
                "batch_size": 128,
                "wall_s": round(wall, 2),
                "walls_s": " ".join(f"{t:.1f}" for t in times),
                "img_per_sec": round(images / wall, 2),
                "top1": top1[mode],
            }
        )
    return rows


def _train_images(data: str) -> int:
    from vtools.data.readers.folder import find_images, resolve_split_dir

    return len(find_images(str(resolve_split_dir(data, "train"))))


def _final_top1(run: Path) -> float:
    """The last epoch's top-1 of a run: summary.csv (train.py and timm's train.py), or the plain loop's
    summary.json."""
    if (run / "summary.csv").exists():
        with open(run / "summary.csv", encoding="utf-8") as handle:
            return round(float(list(csv.DictReader(handle))[-1]["eval_top1"]), 2)
    rows = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    return round(rows[-1]["top1"], 2)


def _run_one(task: str, mode: str, source: str, argv: list[str]) -> Any:
    command = [sys.executable, "-m", "benchmarks", *argv, "--one", task, mode, source]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        from vtools.errors import UsageError

        raise UsageError(f"benchmark {task}/{mode}/{source} failed: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measurements(options: BenchOptions) -> list[tuple[str, str, str]]:
    """(task, mode, source) in the order they run."""
    plan = []
    for task in options.tasks:
        if task in ("recipe", "onepass"):  # whole runs, measured by the parent: measure_recipe, measure_onepass
            continue
        if task == "loader":
            kinds = ("loader-train", "loader-val")
            plan += [(kind, mode, "folder") for kind in kinds for mode in ("vtools", "baseline")]
            plan.append(("host-train", "both", "folder"))
            continue
        if task == "recovery":
            plan.append((task, "ways", "synthetic"))
            continue
        if task == "decode":
            plan += [(task, "vtools", "folder")] + (
                [(task, "vtools", f"wds-max{options.max_side}")] if options.max_side else []
            )
            continue
        for mode in options.modes:
            plan += [(task, mode, source) for source in (options.sources if mode == "vtools" else ["folder"])]
    return plan


def _convert_stores(options: BenchOptions, folder: Path) -> None:
    """The bench images as shards and parquet (and pre-resized shards), once for every measurement."""
    from vtools.data.shard_writer import convert

    wanted = [s for s in options.sources if s != "folder"] if set(options.tasks) - {"decode"} else []
    if "decode" in options.tasks and options.max_side:
        wanted.append(f"wds-max{options.max_side}")
    for store in wanted:
        fmt = "parquet" if store == "parquet" else "wds"
        convert(Path(options.data), folder / store, "bench", fmt, max_side=options.max_side if "max" in store else None)


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
