"""Batches from shards streamed off a server, in an order a resumed run repeats.

Indexed data gets its order from a sampler; a stream cannot, so each loader
worker reads its own shards (``vtools.data.readers.wds_stream.plan_epoch``),
decodes its samples seeded by (seed, epoch, index) as indexed data is, and
yields whole batches, numbered. :class:`StreamBatches`, in the main process,
puts the workers' batches in one fixed order (round robin by batch number, the
order the loader delivers them in) and joins the workers' last, partial batches
into whole ones, so a rank trains the same number of batches every epoch (the
learning-rate schedule needs it) and a resumed epoch can tell each worker how
many of its samples were trained already (``worker_skips``): those are read but
not decoded. The epoch and the resume position reach persistent workers through
shared memory (:class:`StreamOrder`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vtools.data.datasets import DecodedImages, SampleStore
from vtools.data.decode import BadSample, RawSample
from vtools.data.loaders import Batch, collate, make_loader
from vtools.data.readers.wds_stream import (
    EpochPlan,
    StreamedShards,
    StreamLost,
    StreamRecord,
    canonical_batches,
    plan_epoch,
    worker_samples,
    worker_skips,
)
from vtools.data.sampling import SeededSamples
from vtools.errors import UsageError

REPLACEMENT_OCCURRENCE = 1 << 20  # seeds a replacement's augmentation apart from the sample's own


class StreamOrder:
    """The stream's stand-in for the training sampler: the epoch and how many of this rank's samples a
    resumed epoch skips, shared with the loader workers (they live across epochs)."""

    def __init__(self, per_rank: int) -> None:
        self.shared = multiprocessing.RawArray("q", 2)
        self.order = range(per_rank)  # the samples this rank trains per epoch
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip_samples: int = 0) -> None:
        """Select the epoch; skip the samples already trained on (resume mid-epoch)."""
        self.epoch, self.skip = epoch, skip_samples
        self.shared[0], self.shared[1] = epoch, skip_samples

    def __len__(self) -> int:
        return len(self.order) - self.skip


class _Current(SampleStore):
    """A one-sample store: the streamed sample being decoded, so the indexed decoding path serves it."""

    own_names = False

    def __init__(self) -> None:
        self.sample: RawSample | BadSample = BadSample("", "no sample")

    def __len__(self) -> int:
        return 1

    def locate(self, index: int) -> RawSample | BadSample:
        return self.sample

    def name(self, index: int) -> str:
        return getattr(self.sample, "name", None) or getattr(self.sample, "path", "")


class StreamImages(IterableDataset):
    """One rank's decoded batches of a streamed split, made in the loader workers: ``(worker, batch
    number, batch, items)``, or ``(worker, batch number, reason, 0)`` where a shard was lost.

    ``per_rank`` (training) is the samples the rank trains per epoch; None reads every sample once in
    the split's order (validation). With ``replace_bad`` (--on-bad-image skip), a bad sample's place in
    its batch is taken by another sample of the same batch, decoded again with its own augmentation,
    so batches stay whole and the stream's counts do not move.
    """

    def __init__(
        self,
        store: StreamedShards,
        transform: Callable,
        mode: str,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        order: StreamOrder,
        per_rank: int | None,
        shuffle_size: int = 0,
        replace_bad: bool = False,
    ) -> None:
        self.store = store
        self.current = _Current()
        self.decoder = SeededSamples(DecodedImages(self.current, transform, mode), seed)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.order, self.per_rank, self.shuffle_size, self.replace_bad = order, per_rank, shuffle_size, replace_bad

    def __len__(self) -> int:
        return len(self.store)

    def plan(self, workers: int, epoch: int) -> EpochPlan:
        """The rank's shards and quotas for ``epoch`` over ``workers`` loader workers (at least one)."""
        return plan_epoch(
            self.store.counts, self.seed, epoch, self.rank, self.world_size, max(1, workers), self.per_rank
        )

    def __iter__(self) -> Iterator[tuple[int, int, Any, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, skip = int(self.order.shared[0]), int(self.order.shared[1])
        if self.per_rank is None:
            epoch, skip = 0, 0
        plan = self.plan(workers, epoch)
        training = self.per_rank is not None
        skipped = worker_skips(plan.quotas, self.batch_size, skip)[worker] if training else 0
        records = worker_samples(
            self.store,
            plan.shards[worker],
            plan.quotas[worker] if training else None,
            self.shuffle_size if training else 0,
            (self.seed & 0xFFFFFFFF, epoch, self.rank, worker, workers),
        )
        number, pending = 0, []
        try:
            for position, record in enumerate(records):
                if position < skipped:
                    continue  # trained before the resume: read, not decoded
                pending.append(record)
                if len(pending) == self.batch_size:
                    yield worker, number, self._batch(epoch, pending), len(pending)
                    number, pending = number + 1, []
            if pending:
                yield worker, number, self._batch(epoch, pending), len(pending)
        except StreamLost as lost:
            yield worker, number, str(lost), 0

    def _decode(self, epoch: int, record: StreamRecord, occurrence: int = 0) -> tuple[Any, ...]:
        self.current.sample = record.sample
        key = (epoch, record.index, occurrence) if occurrence else (epoch, record.index)
        item = self.decoder[key]
        if isinstance(item[0], BadSample) and self.per_rank is None:
            item = (replace(item[0], where=""), *item[1:])
        return item

    def _batch(self, epoch: int, records: list[StreamRecord]) -> Batch:
        items = [self._decode(epoch, r, r.occurrence) for r in records]
        if self.replace_bad:
            good = [slot for slot, item in enumerate(items) if not isinstance(item[0], BadSample)]
            for slot, item in enumerate(items):
                if isinstance(item[0], BadSample) and good:
                    donor = next((g for g in good if g > slot), good[0])
                    again = self._decode(epoch, records[donor], REPLACEMENT_OCCURRENCE + slot)
                    items[slot] = (*again[:3], [replace(item[0], replaced=True)])
        return collate(items)


class StreamBatches:
    """The loader a :class:`~vtools.data.loaders.DeviceLoader` iterates for a streamed split: the
    workers' batches in one fixed order, the partial ones joined (training), or as they come
    (validation: every sample once, the last batches short)."""

    def __init__(self, loader: DataLoader, images: StreamImages, order: StreamOrder) -> None:
        self.loader = loader
        self.images = images
        self.sampler = order
        self.batch_size = images.batch_size
        self.workers = max(1, loader.num_workers)

    @property
    def dataset(self) -> StreamImages:
        return self.images

    @property
    def pin_memory(self) -> bool:
        return self.loader.pin_memory

    def __len__(self) -> int:
        if self.images.per_rank is not None:
            return len(self.sampler) // self.batch_size
        quotas = self.images.plan(self.workers, 0).quotas
        return sum(-(-quota // self.batch_size) for quota in quotas)

    def __iter__(self) -> Iterator[Batch]:
        epoch, skip = self.sampler.epoch, self.sampler.skip
        batches = iter(self.loader)  # the workers start on this pass now
        if self.images.per_rank is None:
            return self._as_they_come(batches)
        return self._in_order(batches, self.images.plan(self.workers, epoch).quotas, skip)

    def _as_they_come(self, batches: Iterator[tuple[int, int, Any, int]]) -> Iterator[Batch]:
        for _, _, batch, _ in batches:
            if isinstance(batch, str):
                raise StreamLost(batch)
            yield batch

    def _in_order(self, batches: Iterator[tuple[int, int, Any, int]], quotas: list[int], skip: int) -> Iterator[Batch]:
        size = self.batch_size
        tokens = canonical_batches(quotas, size)
        done = min(skip // size, len(tokens))
        before = [0] * len(quotas)
        for w, _ in tokens[:done]:
            before[w] += 1
        pending: dict[tuple[int, int], Batch] = {}
        partial: dict[int, Batch] = {}
        lost: dict[int, tuple[int, str]] = {}

        def take(item: tuple[int, int, Any, int]) -> None:
            w, number, batch, items = item
            if isinstance(batch, str):
                lost[w] = (number, batch)
            elif items < size:
                partial[w] = batch
            else:
                pending[(w, number)] = batch

        for w, original in tokens[done:]:
            key = (w, original - before[w])
            while key not in pending:
                if w in lost and lost[w][0] <= key[1]:
                    raise StreamLost(lost[w][1])
                try:
                    take(next(batches))
                except StopIteration:
                    raise RuntimeError(f"stream worker {w} ended before its batch {key[1]}") from None
            yield pending.pop(key)
        for item in batches:
            take(item)
        if lost:
            raise StreamLost(lost[min(lost)][1])
        if partial:
            yield from _whole(join([partial[w] for w in sorted(partial)]), size)


def join(batches: list[Batch]) -> Batch:
    """One batch of several (the workers' partial ones), in order."""
    first = batches[0]
    jitter = [b.jitter for b in batches if b.jitter is not None]
    return Batch(
        torch.cat([b.images for b in batches if b.images.numel()] or [first.images]),
        torch.cat([b.targets for b in batches]),
        torch.cat([b.indices for b in batches]),
        [record for b in batches for record in b.bad],
        hwc=first.hwc,
        jitter=torch.cat(jitter) if jitter else None,
    )


def _whole(batch: Batch, size: int) -> Iterator[Batch]:
    """``batch`` cut into whole batches of ``size``; a remainder is dropped, as training drops a last
    short batch."""
    for start in range(0, len(batch.targets) - size + 1, size):
        part = slice(start, start + size)
        jitter = batch.jitter[part] if batch.jitter is not None else None
        bad = batch.bad if start == 0 else []
        yield Batch(batch.images[part], batch.targets[part], batch.indices[part], bad, batch.hwc, jitter)


def _as_made(item: Any) -> Any:
    """The workers make whole batches themselves: the loader passes them on as they are."""
    return item


def per_rank_samples(total: int, world_size: int, batch_size: int, what: str) -> int:
    """The samples each rank trains per epoch: whole batches, the same on every rank; one line where a
    rank would get none."""
    batches = total // (world_size * batch_size)
    if batches < 1:
        per = f" per process ({world_size} processes)" if world_size > 1 else ""
        raise UsageError(f"--batch-size {batch_size} is larger than the {total // world_size} samples of {what}{per}")
    return batches * batch_size


def stream_loader(
    store: StreamedShards,
    transform: Callable,
    mode: str,
    batch_size: int,
    device: torch.device,
    workers: int,
    seed: int,
    rank: int,
    world_size: int,
    training: bool,
    shuffle_size: int = 0,
    replace_bad: bool = False,
) -> StreamBatches:
    """A streamed split's loader: training (a seeded shard order and shuffle buffer, whole batches, the
    same count on every rank) or validation (every sample once, in order)."""
    if len(store.urls) < world_size:
        raise UsageError(
            f"the split has {len(store.urls)} shard(s), fewer than the {world_size} processes that read it: "
            "each process streams whole shards"
        )
    per_rank = per_rank_samples(len(store), world_size, batch_size, "the streamed split") if training else None
    order = StreamOrder(per_rank or 0)
    images = StreamImages(
        store, transform, mode, batch_size, seed, rank, world_size, order, per_rank, shuffle_size, replace_bad
    )
    loader = make_loader(images, None, device, workers, persistent=True, seed=seed, collate_fn=_as_made)  # type: ignore[arg-type]
    return StreamBatches(loader, images, order)
