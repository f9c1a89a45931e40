"""Training order and augmentation randomness that depend only on (seed, epoch, index).

Two things make a resumed run identical to an uninterrupted one: the order
of samples in an epoch, and the random augmentation each sample gets. The
order comes from DistributedSampler's seeded per-epoch permutation (one
replica when not distributed). The augmentation comes from seeding the
worker's RNGs from (seed, epoch, index) before each sample, so it does not
depend on which worker decodes a sample or how long workers have lived.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import Dataset, DistributedSampler, Sampler

from vtools.data.decode import BadSample


def sample_seed(seed: int, epoch: int, index: int, occurrence: int = 0) -> int:
    """A well-mixed 63-bit seed per (run seed, epoch, sample); ``occurrence`` tells apart the copies of a
    sample that repeated augmentation puts in one epoch (0 when each sample comes once)."""
    entropy = [seed & 0xFFFFFFFF, epoch, index] + ([occurrence] if occurrence else [])
    mixed = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return int(mixed[0]) << 31 ^ int(mixed[1])


class SeededSamples(Dataset):
    """Wraps a dataset whose items are fetched as ``(epoch, index)`` and seeded from them.

    With ``replace_bad``, an unreadable image (a :class:`~vtools.data.decode.BadSample`)
    is replaced by the next readable one in index order, and the item carries the
    bad ones as a fourth element. Batches then keep their size, which BatchNorm
    and mixup rely on, and the replacement is the same on every run, so exact
    resume still holds. Only when no image at all is readable does the bad one
    come through unreplaced.
    """

    def __init__(self, dataset: Dataset, seed: int, replace_bad: bool = False) -> None:
        self.dataset = dataset
        self.seed = seed
        self.replace_bad = replace_bad

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, ...]) -> Any:
        epoch, index, *occurrence = key
        seed = sample_seed(self.seed, epoch, index, *occurrence)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)  # cpu only: workers must not touch the device
        item = self.dataset[index]
        if not _is_bad(item[0]):
            return item
        item = (replace(item[0], where=f"epoch {epoch}"), *item[1:])  # where in the run, for its message
        return self._replacement(index, item) if self.replace_bad else item

    def _replacement(self, index: int, item: tuple[Any, ...]) -> tuple[Any, ...]:
        bad = [item[0]]
        for offset in range(1, len(self.dataset)):
            candidate = self.dataset[(index + offset) % len(self.dataset)]
            if not _is_bad(candidate[0]):
                return (*candidate[:3], [replace(record, replaced=True) for record in bad[:8]])
            bad.append(replace(candidate[0], where=item[0].where))
        return item


def _is_bad(image: Any) -> bool:
    return isinstance(image, BadSample)


class CompactPermutation(DistributedSampler):
    """DistributedSampler's order (shuffled, the last partial round dropped), held as a tensor of the
    epoch's permutation instead of the list of Python ints it builds (36 bytes an index, 10 MB for
    300 000 images, twice while it slices); same seed, same sizes, same indices."""

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        permutation = torch.randperm(len(self.dataset), generator=generator)  # type: ignore[arg-type]
        return map(int, permutation[: self.total_size][self.rank : self.total_size : self.num_replicas].numpy())


class ResumableEpochs(Sampler[tuple[int, ...]]):
    """What the training samplers share: an ``order`` of this rank's samples per epoch, and
    ``set_epoch(epoch, skip_samples)`` that selects the epoch and skips what a resumed run trained."""

    order: Any
    epoch: int = 0
    skip: int = 0

    def set_epoch(self, epoch: int, skip_samples: int = 0) -> None:
        """Select the epoch's order; skip the samples this rank already trained on (resume mid-epoch)."""
        self.epoch = epoch
        self.skip = skip_samples
        self.order.set_epoch(epoch)


class EpochSampler(ResumableEpochs):
    """Seeded shuffling (sharded across ranks) yielding ``(epoch, index)``, resumable mid-epoch.

    With ``repeats`` (--aug-repeats), the order is timm's ``RepeatAugSampler``'s
    (each sample ``repeats`` times per epoch, its copies on different ranks, the
    permutation seeded by the epoch as timm's is), and each key carries the
    copy's position in the epoch, so every copy gets its own augmentation.
    """

    def __init__(
        self,
        length: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        repeats: float = 0,
    ) -> None:
        self.order: Sampler[int]
        if repeats:
            self.order = RepeatAugSampler(
                range(length), num_replicas=world_size, rank=rank, shuffle=True, num_repeats=repeats
            )
        else:
            self.order = CompactPermutation(
                range(length), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
            )
        self.rank, self.world_size, self.repeats = rank, world_size, repeats

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        if not self.repeats:
            for position, index in enumerate(self.order):
                if position >= self.skip:
                    yield self.epoch, index
            return
        # RepeatAugSampler hands rank r the positions r, r + W, r + 2W ... of the epoch's repeated order
        for local, index in enumerate(self.order):
            if local >= self.skip:
                yield self.epoch, index, 1 + self.rank + local * self.world_size

    def __len__(self) -> int:
        return len(self.order) - self.skip
