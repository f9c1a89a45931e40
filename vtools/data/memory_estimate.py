"""The host memory a run's batches need, checked before any loader starts.

An input size that cannot fit (a config asking for 3x100000x100000) would otherwise be found out by the
kernel: a loader worker killed for memory a minute later. The estimate counts what the loaders hold at
once: each worker's prefetched uint8 batches (in shared memory), the batch it is building (its items
before they are stacked) and one image's decoding and transforms at its stored size, the pinned copy
an accelerator gets; where the device is the host's own cores, also the normalized float32 batch, the
model's activations and (training) its gradients and optimizer state. Every part is linear in the batch
size, so a refusal can name a batch size that fits. It is an estimate of the large terms, not of every
allocation: it refuses what cannot fit, and lets through what might.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vtools.data.decode import RawSample
from vtools.data.loaders import PREFETCH_BATCHES
from vtools.errors import UsageError
from vtools.runtime.device import kind_of, pin_memory

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: a container's own limit, which the OOM killer applies first


@dataclass
class MemoryNeed:
    """Bytes needed as ``fixed + per_image * batch_size``, kept by part for the message."""

    parts: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (fixed, per image of a batch)

    def add(self, name: str, fixed: int = 0, per_image: int = 0) -> None:
        old_fixed, old_per_image = self.parts.get(name, (0, 0))
        self.parts[name] = (old_fixed + int(fixed), old_per_image + int(per_image))

    def part(self, name: str, batch_size: int) -> int:
        fixed, per_image = self.parts[name]
        return fixed + per_image * batch_size

    def at(self, batch_size: int) -> int:
        return sum(self.part(name, batch_size) for name in self.parts)

    def largest_batch(self, available: int) -> int:
        """The largest batch size whose need fits in ``available`` bytes (0: not even one image)."""
        fixed = self.at(0)
        per_image = self.at(1) - fixed
        return max(0, (available - fixed) // per_image) if per_image else 0


def loader_need(
    need: MemoryNeed,
    name: str,
    data_config: dict[str, Any],
    workers: int,
    pinned: bool,
    source_size: tuple[int, int] | None,
    training: bool,
    fixed_batch: int | None = None,
) -> None:
    """Add what one loader holds at once to ``need``: ``workers`` x PREFETCH_BATCHES uint8 batches in
    flight, the items of the batch each process is building, one image through the decoder and the
    transforms per process (``source_size``: the stored images' size, when known), and a pinned copy.
    ``fixed_batch``: this loader's batch size when it does not follow --batch-size."""
    image = math.prod(data_config["input_size"])
    processes = max(1, workers)
    batches = workers * PREFETCH_BATCHES + processes + int(pinned)  # in flight, being built, pinned
    need.add(f"{name} transforms", fixed=processes * _working_bytes(data_config, source_size, training))
    if fixed_batch is None:
        need.add(f"{name} batches", per_image=batches * image)
    else:
        need.add(f"{name} batches", fixed=batches * image * fixed_batch)


def _working_bytes(data_config: dict[str, Any], source_size: tuple[int, int] | None, training: bool) -> int:
    """One image in a worker: decoded (and converted) at its stored size, resized (evaluation: the
    shorter side to input / crop_pct) or cropped and augmented (training), and made a tensor."""
    channels, height, width = data_config["input_size"]
    image = channels * height * width
    source_width, source_height = source_size or (0, 0)
    decoded = 2 * channels * source_width * source_height
    if training:  # crop, resize and a few augmentation ops at the output size, then the tensor
        return decoded + 4 * image
    crop_pct = data_config.get("crop_pct") or 1.0
    aspect = max(source_size) / max(1, min(source_size)) if source_size else 1.0
    resized = channels * math.floor(height / crop_pct) * math.floor(width / crop_pct) * aspect
    return decoded + int(resized) + 2 * image


def host_input_need(need: MemoryNeed, data_config: dict[str, Any]) -> None:
    """The normalized float32 batch (and its memory-layout copy) where the device is the host."""
    need.add("float32 input batch", per_image=2 * 4 * math.prod(data_config["input_size"]))


def stored_image_size(samples: Any) -> tuple[int, int] | None:
    """The first sample's stored size, read from its header (no pixels decoded); None when the store
    is not files or bytes, or the header cannot be read."""
    if not len(samples):
        return None
    try:
        raw = samples.locate(0)
        if not isinstance(raw, RawSample):
            return None
        with warnings.catch_warnings():  # a decompression bomb is named when it is read, not here
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(raw.image) if isinstance(raw.image, bytes) else raw.image) as img:
                return img.size
    except Exception:  # an unreadable first image is reported when it is read; here it only means unknown
        return None


def available_memory() -> int | None:
    """Bytes the host can still give: MemAvailable, or a container's memory limit less its use when that
    is lower; None where neither is known (the check is then skipped)."""
    try:
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
        available: int | None = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = None
    try:
        limit, used = ((CGROUP / name).read_text().strip() for name in ("memory.max", "memory.current"))
        if limit.isdigit():
            left = max(0, int(limit) - int(used))
            available = left if available is None else min(available, left)
    except (OSError, ValueError):
        pass
    return available


@dataclass(frozen=True)
class LoaderUse:
    """One loader a run keeps: its name in messages, preprocessing, samples (whose first stored image
    gives the decoding size), whether it trains, and its batch size when not --batch-size."""

    name: str
    data_config: dict[str, Any]
    samples: Any
    training: bool = False
    batch_size: int | None = None


def check_host_memory(
    loaders: Sequence[LoaderUse],
    batch_size: int,
    device: torch.device,
    workers: int,
    activations: Callable[[], int | None] | None = None,
    weights_state: int = 0,
    ranks_on_host: int = 1,
) -> None:
    """Stop in one line, before any loader starts, when ``loaders`` at ``batch_size`` cannot fit in the
    host's available memory (:func:`host_memory_need` says what is counted)."""
    need = host_memory_need(loaders, device, workers, activations, weights_state, ranks_on_host)
    check_fits(need, batch_size, loaders[0].data_config["input_size"], available_memory())


def host_memory_need(
    loaders: Sequence[LoaderUse],
    device: torch.device,
    workers: int,
    activations: Callable[[], int | None] | None = None,
    weights_state: int = 0,
    ranks_on_host: int = 1,
) -> MemoryNeed:
    """What ``loaders`` (with ``workers`` each) hold at once. Where ``device`` is the host's own cores,
    the float32 input batch, the model's activations per image (``activations()``, None when unknown)
    and ``weights_state`` (gradients and optimizer state) come out of the same memory. ``ranks_on_host``
    processes of a torchrun job each need as much."""
    need = MemoryNeed()
    for use in loaders:
        size = stored_image_size(use.samples)
        loader_need(need, use.name, use.data_config, workers, pin_memory(device), size, use.training, use.batch_size)
    if kind_of(device.type).computes_on_host:
        host_input_need(need, loaders[0].data_config)
        per_image = activations() if activations is not None else None
        need.add("model activations", per_image=per_image or 0)
        need.add("gradients and optimizer state", fixed=weights_state)
    if ranks_on_host > 1:
        need = MemoryNeed({name: (f * ranks_on_host, p * ranks_on_host) for name, (f, p) in need.parts.items()})
    return need


def check_fits(need: MemoryNeed, batch_size: int, input_size: Sequence[int], available: int | None) -> None:
    """Stop in one line when ``need`` at ``batch_size`` exceeds ``available`` host memory, naming the input
    size, what it would need (its largest parts) and a batch size that fits, if any does."""
    total = need.at(batch_size)
    if available is None or total <= available:
        return
    size = "x".join(str(int(side)) for side in input_size)
    largest = sorted(need.parts, key=lambda name: need.part(name, batch_size), reverse=True)[:3]
    parts = ", ".join(f"{name} {_size(need.part(name, batch_size))}" for name in largest)
    fits = need.largest_batch(available)
    advice = (
        f"--batch-size {fits} would fit (or fewer --workers)"
        if fits
        else "not even one image fits: use a smaller input size (--img-size or --input-size)"
    )
    raise UsageError(
        f"input size {size} at batch size {batch_size} needs about {_size(total)} of host memory ({parts}) but "
        f"{_size(available)} is available; {advice}"
    )


def _size(count: float) -> str:
    """Bytes in binary units: ``7.3 TiB``."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    power = min(len(units) - 1, max(0, int(math.log(max(count, 1), 1024))))
    return f"{count / 1024**power:.1f} {units[power]}" if power else f"{int(count)} bytes"
