"""Loaders: decode on CPU workers, ship uint8, normalize on the device.

Workers return uint8 tensors (4x smaller than float32 to pin and copy);
:class:`DeviceLoader` moves each batch to the device, converts and normalizes it
there (and applies the training colour jitter the workers drew, when they did),
and prefetches the next batch on a side stream where the backend has
streams. Loader workers leave SIGINT/SIGTERM/SIGHUP to the main process, and the first
loader with workers registers the exit hook that stops them.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # noqa: F401  (its exit handler must be registered before ours)
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vtools.data import color_jitter
from vtools.data.decode import BadSample
from vtools.data.train_augment import AugmentedImage
from vtools.errors import RunFailed
from vtools.runtime import device as dev
from vtools.runtime.cpu_budget import plan, usable_cores

PREFETCH_BATCHES = 4  # batches each loader worker decodes ahead


@dataclass
class Batch:
    """A collated batch: uint8 images, labels, dataset indices, and any images that failed. Images from
    the fused training augmentation come channels-last (``hwc``: N x H x W x C) with each image's colour
    jitter parameters (``jitter``, on the host) for the device to apply."""

    images: torch.Tensor
    targets: torch.Tensor
    indices: torch.Tensor
    bad: list[BadSample] = field(default_factory=list)
    hwc: bool = False
    jitter: torch.Tensor | None = None

    def pin_memory(self) -> Batch:
        """Called by DataLoader's pin-memory thread."""
        return replace(self, images=self.images.pin_memory(), targets=self.targets.pin_memory())


def _targets(labels: list[Any]) -> torch.Tensor:
    """Class indices (int64), or multi-label samples' multi-hot rows stacked (float32, N x K)."""
    if labels and isinstance(labels[0], np.ndarray):
        return torch.from_numpy(np.stack(labels))
    return torch.tensor(labels, dtype=torch.int64)


def collate(items: list[tuple[Any, ...]]) -> Batch:
    """Stack decoded samples; set bad ones aside. An item may carry a fourth element: the bad
    images it replaces."""
    good = [item for item in items if not isinstance(item[0], BadSample)]
    bad = [item[0] for item in items if isinstance(item[0], BadSample)]
    bad += [record for item in items if len(item) > 3 for record in item[3]]
    targets = _targets([item[1] for item in good])
    indices = torch.tensor([item[2] for item in good], dtype=torch.int64)
    if good and isinstance(good[0][0], AugmentedImage):
        images, jitter = _stack_augmented([item[0] for item in good])
        return Batch(images, targets, indices, bad, hwc=True, jitter=jitter)
    if good:
        images = torch.stack([torch.as_tensor(item[0]) for item in good])
    else:
        images = torch.empty(0, dtype=torch.uint8)
    return Batch(images, targets, indices, bad)


def _stack_augmented(images: list[AugmentedImage]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One N x H x W x C uint8 batch, each image flipped by a reversed view and a grayscale one broadcast
    to every channel as it is copied in; the jitter parameters stacked beside it."""
    height, width = images[0].pixels.shape[:2]
    batch = torch.empty((len(images), height, width, images[0].channels), dtype=torch.uint8)
    slots = batch.numpy()
    for slot, image in zip(slots, images):
        pixels = image.pixels
        if image.hflip:
            pixels = pixels[:, ::-1]
        if image.vflip:
            pixels = pixels[::-1]
        slot[...] = pixels
    if images[0].jitter is None:
        return batch, None
    return batch, torch.from_numpy(np.stack([image.jitter for image in images]))


# the signals a training run stops on after saving a checkpoint (vtools.train.loop.StopRequest): Ctrl-C, a
# scheduler's pre-emption, and a terminal that closes
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def leave_signals_to_main(worker_id: int) -> None:
    """Loader workers ignore the stop signals: a batch scheduler (or a closing terminal) signals the whole
    process group, and the main process must live to save a checkpoint (a worker dying first would crash
    it instead). Workers still end with the main process."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _kill_loader_workers_at_exit() -> None:
    """Stop daemonic children (loader workers) with SIGKILL when the main process exits.

    multiprocessing's own exit handler sends them SIGTERM and then waits; ours
    ignore SIGTERM (leave_signals_to_main), so a run that ends while its workers
    are still up (a failure mid-epoch) would wait forever. atexit runs handlers
    last-in first-out, so this one runs before multiprocessing's. torch's SIGCHLD
    handler would report these deaths as failed workers, so it is reset first.
    """
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()


_exit_hook: list[bool] = []


def _stop_workers_at_exit() -> None:
    """Register :func:`_kill_loader_workers_at_exit` once, when the first loader with workers is made
    (not at import): registered after multiprocessing's own handler, it runs before it."""
    if not _exit_hook:
        atexit.register(_kill_loader_workers_at_exit)
        _exit_hook.append(True)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    device: torch.device,
    workers: int | None = None,
    sampler: Sampler | None = None,
    drop_last: bool = False,
    persistent: bool = True,
    seed: int = 0,
    collate_fn: Callable[[Any], Any] = collate,
) -> DataLoader:
    """A DataLoader with device-aware pinning and persistent workers; order comes from ``sampler``
    (training passes a seeded one), else the dataset's own order. A dataset that makes its own batches
    (``batch_size`` None: shards streamed from a server) passes them through ``collate_fn`` unchanged.

    The loader gets a generator of its own: each new iterator draws a worker seed
    from it, and drawn from the global RNG that would shift the dropout and mixup
    streams of a resumed run, whose first validation comes at another moment.
    """
    workers = plan(device.type, len(usable_cores())).workers if workers is None else workers
    if workers > 0:
        _stop_workers_at_exit()
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        worker_init_fn=leave_signals_to_main,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=dev.pin_memory(device),
        drop_last=drop_last,
        persistent_workers=persistent and workers > 0,
        prefetch_factor=PREFETCH_BATCHES if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )


class DeviceLoader:
    """Iterate a loader's batches already on the device, as normalized float tensors.

    While the model works on batch N, batch N+1 is copied (non_blocking from
    pinned memory) and normalized on a side stream where the backend has one.
    """

    def __init__(
        self,
        loader: DataLoader | KeptBatches,
        device: torch.device,
        mean: Sequence[float],
        std: Sequence[float],
        channels_last: bool = False,
        batch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        on_bad: Callable[[list[BadSample]], None] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.loader = loader
        self.dtype = dtype  # --model-dtype: batches in the model's dtype (normalized in float32 first)
        self.device = device
        shape = (1, len(mean), 1, 1)  # in 0..255 units, as timm's prefetcher: the same float32 results
        self.mean = torch.tensor([value * 255 for value in mean], dtype=torch.float32).view(shape).to(device)
        self.std = torch.tensor([value * 255 for value in std], dtype=torch.float32).view(shape).to(device)
        self.channels_last = channels_last
        self.batch_transform = batch_transform
        self.on_bad = on_bad
        self.non_blocking = dev.non_blocking(device)
        self.stream = dev.new_stream(device)
        self._started: Iterator[Batch] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def started(self) -> bool:
        return self._started is not None

    def start(self) -> None:
        """Have the workers start decoding the next pass now (its order must be set already), so its
        first batches are ready when it begins instead of costing a wait at every epoch's start."""
        if self._started is None:
            self._started = iter(self.loader)

    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    def _to_device(self, batch: Batch) -> Batch:
        images = batch.images.to(self.device, non_blocking=self.non_blocking)
        targets = batch.targets.to(self.device, non_blocking=self.non_blocking)
        if images.numel():
            if batch.hwc:  # NCHW view of the channels-last batch: no copy
                images = images.permute(0, 3, 1, 2)
            if batch.jitter is not None:
                images = color_jitter.apply(images.float(), batch.jitter).sub_(self.mean)
            else:  # uint8 minus float32 is float32: converted and centred in one pass over the batch
                images = torch.sub(images, self.mean)
            images = images.div_(self.std)
            layout = torch.channels_last if self.channels_last else torch.contiguous_format
            images = images.contiguous(memory_format=layout)
            if self.batch_transform is not None:
                images = self.batch_transform(images)
            if self.dtype is not None:
                images = images.to(self.dtype)
        return Batch(images, targets, batch.indices, batch.bad)

    def _prepare(self, batch: Batch, number: int) -> Batch:
        if self.on_bad is not None and batch.bad:
            self.on_bad([replace(bad, where=_and(bad.where, f"batch {number}")) for bad in batch.bad])
        with dev.on_stream(self.device, self.stream):
            return self._to_device(batch)

    def _first_batch_number(self) -> int:
        """The number of this pass's first batch: a resumed epoch starts past the batches it trained."""
        skipped = getattr(getattr(self.loader, "sampler", None), "skip", 0)
        return skipped // max(1, getattr(self.loader, "batch_size", None) or 1)

    def __iter__(self) -> Iterator[Batch]:
        batches, self._started = self._started or iter(self.loader), None
        numbered = enumerate(worker_errors_said(batches), self._first_batch_number())
        if self.stream is None:  # nothing to overlap with: preparing the next batch early would only make
            for number, batch in numbered:  # each step wait for one more batch from the workers
                yield self._prepare(batch, number)
            return
        upcoming: Batch | None = None
        for number, batch in numbered:
            prepared = self._prepare(batch, number)
            if upcoming is not None:
                yield upcoming
            dev.wait_stream(self.device, self.stream, (prepared.images, prepared.targets))
            upcoming = prepared
        if upcoming is not None:
            yield upcoming


def _and(*parts: str) -> str:
    return ", ".join(part for part in parts if part)


def worker_errors_said(batches: Iterator[Batch]) -> Iterator[Batch]:
    """``batches``, with an exception a loader worker raised outside any one sample (items a transform
    left in shapes that do not stack, say) ended as one line instead of torch's wrapped traceback: a
    sample's own failures never get here (they come as bad samples)."""
    try:
        yield from batches
    except Exception as err:
        first, _, rest = str(err).partition("\n")
        if not first.startswith("Caught ") or "DataLoader worker" not in first:
            raise
        cause = next((line.strip() for line in reversed(rest.splitlines()) if line.strip()), first)
        raise RunFailed(f"a data-loader worker failed: {cause} ({first.removeprefix('Caught ').rstrip('.')})") from None


class KeptBatches:
    """A loader whose first complete pass is kept in host memory when its images fit in ``limit_bytes``;
    later passes replay it without decoding.

    train.py validates on the same images every epoch, and with eval transforms they decode to the
    same uint8 batches each time: for a small set (CIFAR-sized, or the shipped data) that decoding
    is work the workers would repeat on cores the model needs. A pass that stops early keeps nothing.
    """

    def __init__(self, loader: DataLoader, limit_bytes: int) -> None:
        self.loader = loader
        self.limit_bytes = limit_bytes
        self.kept: list[Batch] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    def __iter__(self) -> Iterator[Batch]:
        if self.kept is not None:
            return iter(self.kept)
        return self._keeping(iter(self.loader))  # iter() here: the workers start now, not at the first batch

    def _keeping(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        kept: list[Batch] | None = []
        size = 0
        for batch in batches:
            size += batch.images.nbytes
            if kept is not None and size <= self.limit_bytes and batch.images.dtype == torch.uint8:
                kept.append(batch if self.loader.pin_memory else _own_copy(batch))
            else:
                kept = None
            yield batch
        self.kept = kept


def _own_copy(batch: Batch) -> Batch:
    """A batch in this process's memory: one from a worker lives in shared memory, and holding many of
    those would hold as many shared segments (and file descriptors) open. A pinned batch was copied by
    the main process already."""
    return Batch(batch.images.clone(), batch.targets.clone(), batch.indices.clone(), batch.bad)


def eval_device_loader(
    dataset: Dataset,
    batch_size: int,
    device: torch.device,
    workers: int | None,
    data_config: dict[str, Any],
    channels_last: bool,
    on_bad: Callable[[list[BadSample]], None] | None,
    sampler: Sampler | None = None,
    persistent: bool = False,
    keep_bytes: int = 0,
    dtype: torch.dtype | None = None,
) -> DeviceLoader:
    """One pass over ``dataset`` in order, as normalized batches on ``device``; with ``keep_bytes``, a
    set whose images fit in that many bytes is decoded once and replayed (:class:`KeptBatches`)."""
    loader: Any = make_loader(dataset, batch_size, device, workers, sampler=sampler, persistent=persistent)
    if keep_bytes:
        loader = KeptBatches(loader, keep_bytes)
    return DeviceLoader(
        loader,
        device,
        data_config["mean"],
        data_config["std"],
        channels_last=channels_last,
        on_bad=on_bad,
        dtype=dtype,
    )
