"""The loader ceiling: batches delivered to the device as fast as the host makes them, with no model.

On an accelerator host the model no longer runs on the cores, and the images per second per core
that the training transforms reach decide whether the devices wait. This measures train.py's own
loaders (``assemble.build_loaders``, the training or the validation pass) and timm's own
(``create_dataset`` + ``create_loader`` with ``use_prefetcher``, as timm's train.py builds them) on the
same folder, flags and worker count; the batch is finished on the device (normalized, and for
vtools colour-jittered) before it counts, so on a cpu device that work is on the host's cores too. By
default one worker decodes on one core and the main process (one thread) finishes batches on another:
img/s per core is img/s per worker process.
"""

from __future__ import annotations

import resource
import time
from typing import Any

from benchmarks.options import BenchOptions

# timm's train.py defaults for the augmentation, spelled out: both loaders get exactly these
TIMM_TRAIN_AUGMENTATION = {
    "scale": (0.08, 1.0),
    "ratio": (3 / 4, 4 / 3),
    "hflip": 0.5,
    "color_jitter": 0.4,
    "interpolation": "random",
}


def measure_loader(mode: str, split: str, options: BenchOptions) -> dict[str, Any]:
    """img/s, img/s per worker process (one core each) and the fraction of the time spent waiting for the
    workers, over ``options.steps`` batches after ``options.warmup``."""
    import timm

    from vtools.runtime import device as dev
    from vtools.runtime.cpu_budget import setup_cpu_budget, usable_cores

    device = dev.resolve_device(options.device, options.device_modules or ())
    cores = len(usable_cores())
    # per core: by default one worker process on one core, and the main process (one thread: on an
    # accelerator host it only hands batches over) on another, so neither fights the other for a core
    workers = min(1, cores - 1) if options.workers is None else options.workers
    setup_cpu_budget(device, workers, threads=1)
    model = timm.create_model(options.model, num_classes=10)
    batches = (_vtools_batches if mode == "vtools" else _timm_batches)(split, options, model, device, workers)
    iterator = iter(batches)
    for _ in range(options.warmup):
        next(iterator)
    dev.synchronize(device)
    wait = 0.0
    start = time.perf_counter()
    for _ in range(options.steps):
        before = time.perf_counter()
        images = next(iterator)
        wait += time.perf_counter() - before
        images.sum()  # the batch is finished on the device before it counts
    dev.synchronize(device)
    seconds = time.perf_counter() - start
    rate = options.steps * options.batch_size / seconds
    return {
        "task": f"loader-{split}",
        "mode": mode,
        "source": "folder",
        "model": options.model,
        "device": str(device),
        "batch_size": options.batch_size,
        "workers": workers,
        "img_per_sec": round(rate, 2),
        "img_per_sec_per_core": round(rate / max(1, workers), 2),
        "data_wait": round(wait / seconds, 4),
        "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _vtools_batches(split: str, options: BenchOptions, model: Any, device: Any, workers: int) -> Any:
    """train.py's loaders, from train.py's parser with timm's default augmentation."""
    from benchmarks.options import train_job
    from benchmarks.plain_loop import epochs_of
    from vtools.runtime.distributed import DistInfo
    from vtools.train import assemble

    augmentation = TIMM_TRAIN_AUGMENTATION
    flags = [
        options.data,
        "--model",
        options.model,
        "--batch-size",
        str(options.batch_size),
        "--no-channels-last",
        "--scale",
        *map(str, augmentation["scale"]),
        "--ratio",
        *map(str, augmentation["ratio"]),
        "--hflip",
        str(augmentation["hflip"]),
        "--color-jitter",
        str(augmentation["color_jitter"]),
        "--train-interpolation",
        augmentation["interpolation"],
    ]
    job = train_job(flags)
    train_source, val_source, _ = assemble.build_datasets(job.data)
    loaders = assemble.build_loaders(
        job, model, train_source, val_source, device, DistInfo(), workers, keep_decoded=False
    )
    loader = loaders.train if split == "train" else loaders.val
    return (batch.images for batch in epochs_of(loader))


def _timm_batches(split: str, options: BenchOptions, model: Any, device: Any, workers: int) -> Any:
    """timm's dataset and loader as timm's train.py makes them (prefetcher on, so normalization is on the
    device there too)."""
    from pathlib import Path

    from timm.data import create_dataset, create_loader, resolve_data_config

    from benchmarks.plain_loop import epochs_of

    config = resolve_data_config({}, model=model)
    folder = Path(options.data) / ("train" if split == "train" else "val")
    dataset = create_dataset("", root=str(folder), split=split, is_training=split == "train")
    augmentation = TIMM_TRAIN_AUGMENTATION if split == "train" else {"interpolation": config["interpolation"]}
    loader = create_loader(
        dataset,
        input_size=config["input_size"],
        batch_size=options.batch_size,
        is_training=split == "train",
        use_prefetcher=True,
        mean=config["mean"],
        std=config["std"],
        crop_pct=config["crop_pct"],
        num_workers=workers,
        device=device,
        persistent_workers=True,
        **augmentation,
    )
    return (images for images, _ in epochs_of(loader))


HOST_ROUNDS = 5  # alternated rounds per loader: a shared machine drifts, and the median of each is reported


def measure_host_items(options: BenchOptions) -> list[dict[str, Any]]:
    """One core making training batches as a loader worker does for an accelerator (colour jitter left to
    the device, which does not count here): train.py's training items and collate against timm's
    ``ImageDataset`` with timm's transform and ``fast_collate``, in this process, alternating
    HOST_ROUNDS times over the same images; a row per loader with the median."""
    import statistics

    import torch

    torch.set_num_threads(1)
    makers = {mode: _host_batches(mode, options) for mode in ("vtools", "baseline")}
    seconds: dict[str, list[float]] = {mode: [] for mode in makers}
    for _ in range(HOST_ROUNDS):
        for mode, make in makers.items():
            start = time.perf_counter()
            images = make()
            seconds[mode].append(time.perf_counter() - start)
    return [
        {
            "task": "host-train",
            "mode": mode,
            "source": "folder",
            "model": options.model,
            "device": "cpu (one core; jitter left to an accelerator)",
            "batch_size": options.batch_size,
            "workers": 0,
            "img_per_sec": round(images / statistics.median(times), 2),
            "img_per_sec_per_core": round(images / statistics.median(times), 2),
            "walls_s": " ".join(f"{t:.2f}" for t in times),
            "peak_host_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        for mode, times in seconds.items()
    ]


def _host_batches(mode: str, options: BenchOptions) -> Any:
    """A function making ``options.steps`` batches (after ``options.warmup`` untimed ones, made here) and
    returning how many images they held."""
    import timm
    from timm.data import create_dataset, create_transform, resolve_data_config
    from timm.data.loader import fast_collate

    from vtools.data.loaders import collate
    from vtools.data.readers.registry import SourceRequest, open_source
    from vtools.data.sampling import SeededSamples
    from vtools.data.train_augment import fuse

    config = resolve_data_config({}, model=timm.create_model(options.model, num_classes=10))
    transform = create_transform(
        config["input_size"],
        is_training=True,
        use_prefetcher=True,
        mean=config["mean"],
        std=config["std"],
        **TIMM_TRAIN_AUGMENTATION,
    )
    if mode == "vtools":
        fused = fuse(transform, "RGB", computes_on_host=False)
        dataset = SeededSamples(open_source(SourceRequest("", options.data, "train")).images(fused, "RGB"), 0)
        item, join, size = (lambda index: dataset[(0, index)]), collate, len(dataset)
    else:
        timm_set = create_dataset("", root=f"{options.data}/train", split="train", is_training=True)
        timm_set.transform = transform
        item, join, size = (lambda index: timm_set[index]), fast_collate, len(timm_set)
    first = max(
        0, min(options.warmup * options.batch_size, size - options.steps * options.batch_size)
    )  # warm-up if it fits
    last = min(size, first + options.steps * options.batch_size)
    for index in range(first):
        item(index)

    def make() -> int:
        for start in range(first, last, options.batch_size):
            join([item(index) for index in range(start, min(last, start + options.batch_size))])
        return last - first

    return make
