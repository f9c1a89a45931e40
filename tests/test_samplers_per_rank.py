"""Each rank's share of the data, as train.py builds its samplers, stated as properties of the shares.

Training without --aug-repeats: the ranks' shares are disjoint, equal in size, and together cover the set
(bar the fewer-than-world-size samples the even split drops). With --aug-repeats R: merging the ranks by
the position each copy carries gives timm's repeated order, runs of R copies of one sample, every run
another sample, so each copy goes to its own rank. Validation: every sample on exactly one rank.
A sampler that ignored its rank would hand every rank the same share: these properties fail.
"""

from __future__ import annotations

import argparse
import itertools

import pytest

from vtools.runtime.distributed import DistInfo
from vtools.train.assemble import train_sampler, validation_sampler

pytestmark = pytest.mark.cpu_only(reason="samplers yield indices on the host")


def shares(length: int, world: int, epoch: int, repeats: float = 0) -> list[list[tuple[int, ...]]]:
    """Every rank's keys for ``epoch``: (epoch, index) or, with repeats, (epoch, index, position)."""
    args = argparse.Namespace(seed=7, aug_repeats=repeats)
    result = []
    for rank in range(world):
        sampler = train_sampler(length, args, DistInfo(rank, world))
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
