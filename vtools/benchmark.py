"""``python -m vtools bench``: throughput of train / validate / inference, vtools against a plain baseline.

For each task it measures, each in a fresh process (so start-up and peak
memory belong to that measurement alone):

- ``model``: the model alone on synthetic batches already on the device;
- ``vtools``: end to end on a real image folder through vtools' loaders
  (uint8 batches, device-side normalization, prefetching);
- ``baseline``: the same work written plainly: a timm model, torchvision's
  ImageFolder and DataLoader, timm's transforms normalizing in the workers.

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
import resource
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

TASKS = ("train", "validate", "inference", "decode")
MODES = ("model", "vtools", "baseline")
SOURCES = ("folder", "wds", "parquet")
STORE_KINDS = {"wds": "wds/bench", "parquet": "hfds/bench"}


def build_parser() -> argparse.ArgumentParser:
    from vtools.cli import OneLineParser  # here, not at the top: the parent process stays light

    parser = OneLineParser(prog="python -m vtools bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="timm model (default: resnet18, 224 px)")
    parser.add_argument("--data", default="data/fashion-mnist-mini", help="image folder with train/ and val/")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS[:3]), choices=TASKS,
                        help="(default: train validate inference; decode: one core decoding, no model)")
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


def _step_fn(task: str, model: Any, amp: Any, device: Any) -> Any:
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
    import timm
    import torch

    from vtools import device as dev
    from vtools.amp import resolve_amp

    if task == "decode":
        return measure_decode(source, args)
    device = dev.resolve_device(args.device, args.device_modules)
    amp = resolve_amp(device, args.amp, args.amp_dtype)
    model = timm.create_model(args.model, num_classes=10).to(device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    startup = process_age()
    step = _step_fn(task, model, amp, device)
    timer = Timer(device)
    total = args.warmup + args.steps
    dev.reset_peak_memory(device)
    batches = _batches(task, mode, source, args, model, device, total)
    for images, targets in timer.iterate(batches, args.warmup, args.steps):
        step(images, targets)
    images = args.steps * args.batch_size
    peak = dev.peak_memory_bytes(device)
    return {"task": task, "mode": mode, "source": source if mode == "vtools" else "folder", "model": args.model,
            "device": str(device), "amp_dtype": amp.dtype_name,
            "channels_last": args.channels_last, "batch_size": args.batch_size,
            "img_per_sec": round(images / timer.seconds, 2),
            "data_wait": round(timer.wait / timer.seconds, 4), "startup_s": round(startup, 2),
            "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "peak_device_mib": round(peak / 2**20, 1) if peak is not None else None}


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


def _batches(task: str, mode: str, source: str, args: argparse.Namespace, model: Any, device: Any,
             count: int) -> Any:
    """The batches a measurement consumes: synthetic, vtools' loader, or the plain baseline's."""
    import torch

    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    if mode == "model":
        images = torch.randn(args.batch_size, *size, device=device)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        targets = torch.randint(0, 10, (args.batch_size,), device=device)
        return iter(lambda: (images, targets), None)
    from vtools.data import resolve_split_dir

    split = "train" if task == "train" else "validation"
    if mode == "vtools":
        return _vtools_batches(task, args, model, device, _open(source, split, args), count)
    return _baseline_batches(task, args, model, device, resolve_split_dir(args.data, split), count)


def _vtools_batches(task: str, args: argparse.Namespace, model: Any, device: Any, source: Any, count: int) -> Any:
    from timm.data import create_transform

    from vtools import data as vdata
    from vtools.sampling import EpochSampler, SeededSamples

    config = vdata.data_config_for(model, {})
    if task == "train":
        transform = create_transform(config["input_size"], is_training=True, use_prefetcher=True)
        dataset = SeededSamples(source.images(transform, "RGB"), seed=0)
        sampler = EpochSampler(len(dataset), seed=0)
        loader = vdata.make_loader(dataset, args.batch_size, device, args.workers, sampler=sampler, drop_last=True)
    else:
        dataset = source.images(vdata.eval_transform(config), "RGB")
        loader = vdata.make_loader(dataset, args.batch_size, device, args.workers)
    device_loader = vdata.DeviceLoader(loader, device, config["mean"], config["std"],
                                       channels_last=args.channels_last)
    return ((batch.images, batch.targets) for batch in islice(_forever(device_loader), count))


def _baseline_batches(task: str, args: argparse.Namespace, model: Any, device: Any, root: Path, count: int) -> Any:
    """What a user writes without vtools: ImageFolder + timm transform + DataLoader, .to(device) per batch."""
    import torch
    import torchvision
    from timm.data import create_transform, resolve_data_config

    from vtools.data import default_workers

    config = resolve_data_config(model=model)
    transform = create_transform(**config, is_training=task == "train")
    dataset = torchvision.datasets.ImageFolder(str(root), transform=transform)
    workers = default_workers() if args.workers is None else args.workers
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=task == "train",
                                         num_workers=workers, drop_last=task == "train")

    def moved() -> Any:
        for images, targets in islice(_forever(loader), count):
            images = images.to(device)
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, targets.to(device)

    return moved()


def _forever(loader: Any) -> Any:
    while True:
        yield from loader


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
    """vtools end to end relative to the model alone, and to the baseline, per task."""
    by_key = {(row["task"], row["mode"]): row for row in rows}
    for row in rows:
        if row["mode"] != "vtools":
            continue
        model = by_key.get((row["task"], "model"))
        baseline = by_key.get((row["task"], "baseline"))
        if model:
            row["vs_model"] = round(row["img_per_sec"] / model["img_per_sec"], 3)
        if baseline:
            row["vs_baseline"] = round(row["img_per_sec"] / baseline["img_per_sec"], 3)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    args = build_parser().parse_args(argv)
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
    add_ratios(rows)
    print(format_table(rows, ["task", "mode", "source", "img_per_sec", "data_wait", "vs_model", "vs_baseline",
                              "startup_s", "peak_host_mib", "peak_device_mib", "amp_dtype", "channels_last"]))
    if args.output:
        write_rows(args.output, rows, "json" if args.output.endswith(".json") else "csv")
        print(f"written to {args.output}")
    return 0
