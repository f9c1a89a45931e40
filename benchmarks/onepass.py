"""One pass over a large folder: the workload every ImageNet epoch is, where nothing decoded is reused.

Three measurements on the same flags (timm's names, timm's default augmentation), whole runs
alternated ``--repeats`` times by the bench:

- the model alone: train.py's ``train_one_epoch`` on one batch resident on the device for the epoch's
  step count, then ``evaluate`` for the validation batches, in the faster of NCHW and channels_last
  (probed on a few steps first); the time of those two loops only, in a child process;
- vtools: ``train.py``, from launch to exit;
- timm's way: timm's own ``train.py`` when ``--timm-train`` names one (a checkout of timm's scripts),
  else the plain timm-style loop (benchmarks/plain_loop.py), from launch to exit.
"""

from __future__ import annotations

import math
import time
from typing import Any

from benchmarks.options import BenchOptions

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


def measure_model_epoch(options: BenchOptions) -> dict[str, Any]:
    """The model alone over the epoch's steps and validation batches (see the module docstring)."""
    train_images, val_images = split_counts(options.data)
    steps, val_batches = train_images // 128, math.ceil(val_images / 128)
    probe = {layout: _model_seconds(options, layout, PROBE_STEPS, 0) for layout in (False, True)}
    channels_last = probe[True] < probe[False]
    seconds = _model_seconds(options, channels_last, steps, val_batches)
    return {
        "task": "onepass",
        "mode": "model",
        "source": "folder",
        "model": options.model,
        "channels_last": channels_last,
        "batch_size": 128,
        "epochs": 1,
        "wall_s": round(seconds, 2),
        "img_per_sec": round((steps * 128 + val_images) / seconds, 2),
    }


def _model_seconds(options: BenchOptions, channels_last: bool, steps: int, val_batches: int) -> float:
    """Seconds of train_one_epoch over ``steps`` copies of one resident batch, then evaluate over
    ``val_batches``."""
    import timm

    from benchmarks.options import train_job
    from vtools.evaluation.loops import evaluate
    from vtools.runtime import device as dev
    from vtools.runtime.amp import resolve_amp
    from vtools.runtime.cpu_budget import setup_cpu_budget
    from vtools.runtime.distributed import DistInfo
    from vtools.train import assemble
    from vtools.train.loop import train_one_epoch

    device = dev.resolve_device(options.device, options.device_modules or ())
    setup_cpu_budget(device, options.workers)
    amp = resolve_amp(device, False, "auto")
    layout = "--channels-last" if channels_last else "--no-channels-last"
    job = train_job([options.data, *ONEPASS_FLAGS, "--model", options.model, layout])
    model = timm.create_model(options.model, num_classes=10).to(device)
    train_source, val_source, _ = assemble.build_datasets(job.data)
    loaders = assemble.build_loaders(job, model, train_source, val_source, device, DistInfo(), 0)
    parts, _, _ = assemble.build_components(job, model, loaders, 10, device, amp, DistInfo())
    batch = resident_batch(device, channels_last)
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


def resident_batch(device: Any, channels_last: bool, batch_size: int = 128, size: int = 32) -> Any:
    """A fixed random batch of ``batch_size`` images of ``size`` px, already on the device."""
    import torch

    from vtools.data.loaders import Batch

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, 3, size, size, generator=generator).to(device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    targets = torch.randint(0, 10, (batch_size,), generator=generator).to(device)
    return Batch(images, targets, torch.arange(batch_size))


def run_commands(options: BenchOptions, folder: Any) -> dict[str, list[str]]:
    """train.py and timm's way (the bench's ``baseline``) on the same command line: 1 epoch, fp32."""
    import sys

    flags = [*ONEPASS_FLAGS, "--model", options.model, "--epochs", "1", "--device", options.device]
    if options.workers is not None:
        flags += ["-j", str(options.workers)]
    vtools = [sys.executable, "-m", "vtools", "train", options.data, *flags, "--output", str(folder)]
    if options.timm_train:
        baseline = [sys.executable, options.timm_train, "--data-dir", options.data, *flags, "--output", str(folder)]
    else:
        baseline = [sys.executable, "-m", "benchmarks.plain_loop", "--data-dir", options.data, *flags]
    return {"vtools": vtools, "baseline": baseline}
