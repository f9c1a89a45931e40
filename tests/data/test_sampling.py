"""Each rank's share of the data, as train.py builds its samplers, stated as properties of the shares.

Training without --aug-repeats: the ranks' shares are disjoint, equal in size, and together cover the set
(bar the fewer-than-world-size samples the even split drops). With --aug-repeats R: merging the ranks by
the position each copy carries gives timm's repeated order, runs of R copies of one sample, every run
another sample, so each copy goes to its own rank. Validation: every sample on exactly one rank.
A sampler that ignored its rank would hand every rank the same share: these properties fail.
"""

from __future__ import annotations

import itertools

import pytest

from vtools.runtime.distributed import DistInfo
from vtools.train.assemble import train_sampler, validation_sampler

pytestmark = pytest.mark.cpu_only(reason="samplers yield indices on the host")


def shares(length: int, world: int, epoch: int, repeats: float = 0) -> list[list[tuple[int, ...]]]:
    """Every rank's keys for ``epoch``: (epoch, index) or, with repeats, (epoch, index, position)."""
    result = []
    for rank in range(world):
        sampler = train_sampler(length, 7, repeats, DistInfo(rank, world))
        sampler.set_epoch(epoch)
        keys = list(sampler)
        assert len(keys) == len(sampler)
        result.append(keys)
    return result


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("length", [12, 13, 50])
def test_training_shares_are_disjoint_equal_and_cover_the_set(world: int, length: int) -> None:
    orders = []
    for epoch in range(3):
        indices = [[key[1] for key in keys] for keys in shares(length, world, epoch)]
        assert {len(share) for share in indices} == {length // world}
        flat = list(itertools.chain(*indices))
        assert len(set(flat)) == len(flat) == length - length % world  # disjoint, and all but the remainder
        assert set(flat) <= set(range(length))
        orders.append(flat)
    assert orders[0] != orders[1]  # a new order each epoch
    assert shares(length, world, 1) == shares(length, world, 1)  # and the same one again for a resume


@pytest.mark.parametrize(("world", "repeats"), [(2, 3), (3, 2), (2, 2), (3, 4)])
def test_repeated_copies_go_to_different_ranks_and_cover_the_order(world: int, repeats: int) -> None:
    length = 40
    for epoch in range(2):
        keys = list(itertools.chain(*shares(length, world, epoch, repeats)))
        positions = [key[2] for key in keys]
        assert sorted(positions) == list(range(1, len(keys) + 1))  # each copy's place, once
        merged = [index for _, index, _ in sorted(keys, key=lambda key: key[2])]
        runs = [(index, len(list(group))) for index, group in itertools.groupby(merged)]
        assert all(size == repeats for _, size in runs[:-1]) and 0 < runs[-1][1] <= repeats
        assert len({index for index, _ in runs}) == len(runs)  # every run another sample
        by_rank = {}
        for rank, share in enumerate(shares(length, world, epoch, repeats)):
            for _, index, position in share:
                assert (position - 1) % world == rank  # the copy's place says which rank holds it
                by_rank.setdefault(index, []).append(rank)
        assert all(len(set(ranks)) == min(len(ranks), world) for ranks in by_rank.values())


@pytest.mark.parametrize("world", [2, 3])
def test_fractional_repeats_keep_copies_apart(world: int) -> None:
    keys = list(itertools.chain(*shares(30, world, 0, repeats=1.5)))
    assert sorted(key[2] for key in keys) == list(range(1, len(keys) + 1))
    merged = [index for _, index, _ in sorted(keys, key=lambda key: key[2])]
    runs = [(index, len(list(group))) for index, group in itertools.groupby(merged)]
    assert {size for _, size in runs[:-1]} <= {1, 2} and len({i for i, _ in runs}) == len(runs)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [0, 1, 5, 7, 59])
def test_validation_shares_hold_every_sample_once(world: int, length: int) -> None:
    indices = [list(validation_sampler(length, DistInfo(rank, world))) for rank in range(world)]
    flat = list(itertools.chain(*indices))
    assert sorted(flat) == list(range(length))
    assert max(map(len, indices)) - min(map(len, indices)) <= 1


def test_sample_seeds_are_fixed_by_run_epoch_index_and_copy() -> None:
    """A sample's augmentation seed is a function of (run seed, epoch, index, copy): the same on a resume,
    different for every other sample, epoch, copy and run; the run seed counts modulo 2**32 as numpy's."""
    from vtools.data.sampling import sample_seed

    first = sample_seed(7, 1, 5)
    assert first == sample_seed(7, 1, 5) == sample_seed(7, 1, 5, 0)
    seeds = {sample_seed(7, epoch, index, copy) for epoch in range(3) for index in range(5) for copy in range(3)}
    assert len(seeds) == 45
    assert all(0 <= seed < 2**63 for seed in seeds) and max(seeds) >= 2**40  # 63 bits, used
    assert sample_seed(8, 1, 5) != first and sample_seed(7 + 2**32, 1, 5) == first


def test_a_sampler_without_ranks_is_the_whole_shuffled_set_from_epoch_0() -> None:
    """Defaults: one process, no repeats, epoch 0 before any set_epoch, nothing skipped."""
    from vtools.data.sampling import EpochSampler

    sampler = EpochSampler(20, seed=3)
    keys = list(sampler)
    assert len(keys) == len(sampler) == 20 and {epoch for epoch, _ in keys} == {0}
    indices = [index for _, index in keys]
    assert sorted(indices) == list(range(20)) and indices != list(range(20))  # all of them, shuffled
    assert indices != [index for _, index in EpochSampler(20, seed=4)]  # the run's seed sets the order


@pytest.mark.parametrize("repeats", [0, 3])
def test_a_resumed_epoch_skips_exactly_what_was_trained(repeats: int) -> None:
    """set_epoch(e, skip_samples=k) continues epoch e after its first k samples, keys and all."""
    whole = train_sampler(30, 7, repeats, DistInfo(1, 2))
    whole.set_epoch(2)
    resumed = train_sampler(30, 7, repeats, DistInfo(1, 2))
    resumed.set_epoch(2, skip_samples=4)
    keys = list(resumed)
    assert keys == list(whole)[4:] and len(resumed) == len(keys) and {key[0] for key in keys} == {2}


def test_repeated_order_is_shuffled() -> None:
    keys = list(itertools.chain(*shares(40, 2, 0, repeats=2)))
    runs = [index for index, _ in itertools.groupby(i for _, i, _ in sorted(keys, key=lambda key: key[2]))]
    assert runs != sorted(runs)


class _Draws:
    """A dataset whose items are what its transforms would draw from each random stream they use (timm's
    RandomResizedCrop and RandAugment draw from Python's random, others from numpy's or torch's)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple:
        import random

        import numpy as np
        import torch

        return (random.random(), float(np.random.rand()), float(torch.rand(1))), index


def test_each_random_stream_is_seeded_by_the_sample_so_a_resume_draws_the_same() -> None:
    from vtools.data.sampling import SeededSamples

    samples = SeededSamples(_Draws(), seed=5)
    first = samples[(1, 2)][0]
    samples[(0, 3)]  # another sample between: the streams are seeded afresh for each
    assert samples[(1, 2)][0] == first
    assert all(a != b for a, b in zip(samples[(1, 3)][0], first))  # every stream differs for another sample


class _SomeBad:
    """Items 1, 2 and 3 cannot be read; the others can."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple:
        from vtools.data.decode import BadSample

        if index in (1, 2, 3):
            return BadSample(f"img{index}.jpg", "truncated", step="decode"), index, None
        return f"pixels {index}", index, None


def test_a_bad_image_is_replaced_by_the_next_readable_one_and_every_bad_one_on_the_way_is_reported() -> None:
    from vtools.data.sampling import SeededSamples

    pixels, label, _, reported = SeededSamples(_SomeBad(), seed=0, replace_bad=True)[(2, 1)]
    assert (pixels, label) == ("pixels 4", 4)
    assert [(bad.path, bad.where, bad.replaced) for bad in reported] == [
        (f"img{index}.jpg", "epoch 2", True) for index in (1, 2, 3)
    ]
    assert SeededSamples(_SomeBad(), seed=0)[(2, 1)][0].replaced is False  # without replacing: carried as is
