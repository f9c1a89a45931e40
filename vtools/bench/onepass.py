"""One pass over a large folder: the workload every ImageNet epoch is, where nothing decoded is reused.

Three measurements on the same flags (timm's names, timm's default augmentation), whole runs
alternated ``--repeats`` times by the bench:

- the model alone: train.py's ``train_one_epoch`` on one batch resident on the device for the epoch's
  step count, then ``evaluate`` for the validation batches, in the faster of NCHW and channels_last
  (probed on a few steps first); the time of those two loops only, in a child process;
- vtools: ``train.py``, from launch to exit;
- timm's way: timm's own ``train.py`` when ``--timm-train`` names one (a checkout of timm's scripts),
  else the plain timm-style loop (vtools/bench/plain_loop.py), from launch to exit.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

# the size and schedule the bench's whole runs share (the recipe task adds its augmentation overrides)
SCHEDULE_FLAGS = (
    *("--img-size", "32", "--crop-pct", "1.0", "--batch-size", "128"),
    *("--opt", "sgd", "--lr", "0.1", "--weight-decay", "5e-4", "--sched", "cosine"),
    *("--smoothing", "0.1", "--seed", "42"),
)

# no augmentation overrides: timm's default augmentation (scale 0.08-1, ratio 3/4-4/3, random
# interpolation, colour jitter 0.4, horizontal flip) is what users run
ONEPASS_FLAGS = (*SCHEDULE_FLAGS, "--warmup-epochs", "0")

PROBE_STEPS = 12


def split_counts(data: str) -> tuple[int, int]:
    """Training and validation images in the bench folder."""
    from vtools.data.readers.folder import find_images, resolve_split_dir

    return tuple(len(find_images(str(resolve_split_dir(data, split)))) for split in ("train", "validation"))


def measure_model_epoch(args: argparse.Namespace) -> dict[str, Any]:
    """The model alone over the epoch's steps and validation batches (see the module docstring)."""
    train_images, val_images = split_counts(args.data)
    steps, val_batches = train_images // 128, math.ceil(val_images / 128)
    probe = {layout: _model_seconds(args, layout, PROBE_STEPS, 0) for layout in (False, True)}
    channels_last = probe[True] < probe[False]
    seconds = _model_seconds(args, channels_last, steps, val_batches)
    return {
        "task": "onepass",
        "mode": "model",
        "source": "folder",
        "model": args.model,
        "channels_last": channels_last,
        "batch_size": 128,
        "epochs": 1,
        "wall_s": round(seconds, 2),
        "img_per_sec": round((steps * 128 + val_images) / seconds, 2),
    }


def _model_seconds(args: argparse.Namespace, channels_last: bool, steps: int, val_batches: int) -> float:
    """Seconds of train_one_epoch over ``steps`` copies of one resident batch, then evaluate over
    ``val_batches``."""
    import timm

    from vtools.cli import train_flags
    from vtools.evaluation.loops import evaluate
    from vtools.runtime import device as dev
    from vtools.runtime.amp import resolve_amp
    from vtools.runtime.cpu_budget import setup_cpu_budget
    from vtools.runtime.distributed import DistInfo
    from vtools.train import assemble
    from vtools.train.loop import train_one_epoch

    device = dev.resolve_device(args.device, args.device_modules or ())
    setup_cpu_budget(device, args.workers)
    amp = resolve_amp(device, False, "auto")
    train_args = train_flags.build_parser().parse_args(
        [args.data, *ONEPASS_FLAGS, "--model", args.model, "--channels-last" if channels_last else "--no-channels-last"]
    )
    train_args.data_dir = train_args.data
    model = timm.create_model(args.model, num_classes=10).to(device)
    train_source, val_source, _ = assemble.build_datasets(train_args)
    loaders = assemble.build_loaders(train_args, model, train_source, val_source, device, DistInfo(), 0)
    parts, _, _ = assemble.build_components(train_args, model, loaders, 10, device, amp, DistInfo())
    batch = _resident_batch(device, channels_last)
    start = time.perf_counter()
    train_one_epoch(parts, Repeated(batch, steps), 0, 0, steps, show_progress=False)
    if val_batches:
        evaluate(model, Repeated(batch, val_batches), device, amp, show_progress=False)
    dev.synchronize(device)
    return time.perf_counter() - start


class Repeated:
    """One batch ``times`` times, with a length (the loops' progress and accumulation read it)."""

    def __init__(self, batch: Any, times: int) -> None:
        self.batch, self.times = batch, times

    def __len__(self) -> int:
        return self.times

    def __iter__(self) -> Any:
        return (self.batch for _ in range(self.times))


def _resident_batch(device: Any, channels_last: bool) -> Any:
    import torch

    from vtools.data.loaders import Batch

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(128, 3, 32, 32, generator=generator).to(device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    targets = torch.randint(0, 10, (128,), generator=generator).to(device)
    return Batch(images, targets, torch.arange(128))


def run_commands(args: argparse.Namespace, folder: Any) -> dict[str, list[str]]:
    """train.py and timm's way (the bench's ``baseline``) on the same command line: 1 epoch, fp32."""
    import sys

    flags = [*ONEPASS_FLAGS, "--model", args.model, "--epochs", "1", "--device", args.device]
    if args.workers is not None:
        flags += ["-j", str(args.workers)]
    vtools = [sys.executable, "-m", "vtools", "train", args.data, *flags, "--output", str(folder)]
    if args.timm_train:
        baseline = [sys.executable, args.timm_train, "--data-dir", args.data, *flags, "--output", str(folder)]
    else:
        baseline = [sys.executable, "-m", "vtools.bench.plain_loop", "--data-dir", args.data, *flags]
    return {"vtools": vtools, "baseline": baseline}
