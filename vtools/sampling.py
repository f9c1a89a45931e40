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
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed per (run seed, epoch, sample)."""
    mixed = np.random.SeedSequence([seed & 0xFFFFFFFF, epoch, index]).generate_state(2, dtype=np.uint32)
    return int(mixed[0]) << 31 ^ int(mixed[1])


class SeededSamples(Dataset):
    """Wraps a dataset whose items are fetched as ``(epoch, index)`` and seeded from them."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        seed = sample_seed(self.seed, epoch, index)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)  # cpu only: workers must not touch the device
        return self.dataset[index]


class EpochSampler(Sampler[tuple[int, int]]):
    """Seeded shuffling (sharded across ranks) yielding ``(epoch, index)``, resumable mid-epoch."""

    def __init__(self, length: int, seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True) -> None:
        self.order = DistributedSampler(range(length), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                        seed=seed, drop_last=True)
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip_samples: int = 0) -> None:
        """Select the epoch's permutation; skip samples already trained on (resume mid-epoch)."""
        self.epoch = epoch
        self.skip = skip_samples
        self.order.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for position, index in enumerate(self.order):
            if position >= self.skip:
                yield self.epoch, index

    def __len__(self) -> int:
        return len(self.order) - self.skip
