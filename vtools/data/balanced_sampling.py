"""Class-balanced training order for --balanced-sampler: draws by inverse class frequency.

On imbalanced data a shuffled epoch shows the model mostly the large classes. Drawing each
epoch's samples with replacement, each weighted by one over its class's count, shows every
class at the same expected rate. :class:`BalancedEpochSampler` is a drop-in replacement for
:class:`~vtools.data.sampling.EpochSampler`: it yields ``(epoch, index)``, has an ``order``
whose length is each rank's share, and resumes mid-epoch exactly, because the epoch's draw
depends only on (seed, epoch) and each rank takes fixed positions of it. Draws are held as
arrays, not lists of Python ints, so a 1.28 M-sample set stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from vtools.data.sampling import ResumableEpochs
from vtools.errors import UsageError

_STREAM = 0xBA1A  # keeps the balanced draw's seeds apart from other streams seeded by (seed, epoch)


def class_balanced_weights(labels: np.ndarray) -> torch.Tensor:
    """Each sample's weight, one over its class's count (0 for unlabelled, label < 0), so that every
    class is drawn at the same expected rate; refuses a set with no labelled sample."""
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    labelled = labels >= 0
    if not labelled.any():
        raise UsageError(
            f"--balanced-sampler needs class labels, but none of the {labels.size} training samples has one"
        )
    counts = np.bincount(labels[labelled])
    weights = np.zeros(labels.size, dtype=np.float64)
    weights[labelled] = 1.0 / counts[labels[labelled]]
    return torch.from_numpy(weights)


def epoch_draw(weights: torch.Tensor, seed: int, epoch: int) -> np.ndarray:
    """The epoch's ``len(weights)`` draws with replacement, the same on every rank and every run."""
    mixed = np.random.SeedSequence([seed & 0xFFFFFFFF, epoch, _STREAM]).generate_state(2, dtype=np.uint32)
    generator = torch.Generator()
    generator.manual_seed(int(mixed[0]) << 31 ^ int(mixed[1]))
    return torch.multinomial(weights, len(weights), replacement=True, generator=generator).numpy()


class BalancedOrder(Sampler[int]):
    """This rank's indices of the epoch's balanced draw: positions rank, rank + W, rank + 2W ... of its
    first ``N - N % W`` draws, so ranks get equal, disjoint shares that together are the whole draw."""

    def __init__(self, labels: np.ndarray, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.weights = class_balanced_weights(labels)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.total_size = len(self.weights) - len(self.weights) % world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose draw is taken."""
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        """This rank's share of the current epoch's draw, as an array."""
        draw = epoch_draw(self.weights, self.seed, self.epoch)
        return draw[: self.total_size][self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        return map(int, self.indices())

    def __len__(self) -> int:
        return self.total_size // self.world_size


class BalancedEpochSampler(ResumableEpochs):
    """Class-balanced draws (sharded across ranks) yielding ``(epoch, index)``, resumable mid-epoch;
    the same interface as :class:`~vtools.data.sampling.EpochSampler` without repeats."""

    def __init__(self, labels: np.ndarray, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.order = BalancedOrder(labels, seed, rank, world_size)
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return ((epoch, index) for index in map(int, self.order.indices()[self.skip :]))

    def __len__(self) -> int:
        return max(len(self.order) - self.skip, 0)
