"""--balanced-sampler's order, stated as properties: every class drawn at an equal rate (where a plain
draw would not be), ranks' shares interleave into the single-process draw, a resume continues it exactly,
the draw depends only on (seed, epoch), unlabelled samples are never drawn, and the sampler is sized as
EpochSampler is, so the training code can use either.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vtools.data.balanced_sampling import BalancedEpochSampler, class_balanced_weights, epoch_draw
from vtools.data.sampling import EpochSampler
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="samplers yield indices on the host")

COUNTS = (1000, 100, 10)


def imbalanced_labels(counts: tuple[int, ...] = COUNTS) -> np.ndarray:
    """Class c repeated counts[c] times, the classes interleaved by a fixed shuffle."""
    labels = np.concatenate([np.full(count, c) for c, count in enumerate(counts)])
    return np.random.default_rng(0).permutation(labels)


def keys(
    labels: np.ndarray, epoch: int, rank: int = 0, world: int = 1, skip: int = 0, seed: int = 7
) -> list[tuple[int, int]]:
    sampler = BalancedEpochSampler(labels, seed, rank, world)
    sampler.set_epoch(epoch, skip_samples=skip)
    result = list(sampler)
    assert len(result) == len(sampler)
    return result


def five_sigma(share: float, draws: int) -> float:
    """Five binomial standard deviations of a class's share of ``draws`` draws."""
    return 5 * math.sqrt(share * (1 - share) / draws)


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_every_class_is_drawn_at_an_equal_rate(epoch: int) -> None:
    labels = imbalanced_labels()
    drawn = np.array([index for _, index in keys(labels, epoch)])
    assert len(drawn) == len(labels)
    shares = np.bincount(labels[drawn], minlength=len(COUNTS)) / len(drawn)
    tolerance = five_sigma(1 / len(COUNTS), len(drawn))  # about 0.07 for 1110 draws
    assert np.all(np.abs(shares - 1 / len(COUNTS)) < tolerance), shares
    # the bound has teeth: a draw that ignored the classes' counts fails it
    plain = epoch_draw(torch.ones(len(labels), dtype=torch.float64), 7, epoch)
    plain_shares = np.bincount(labels[plain], minlength=len(COUNTS)) / len(plain)
    assert np.any(np.abs(plain_shares - 1 / len(COUNTS)) >= tolerance), plain_shares


def test_weights_are_one_over_the_class_count() -> None:
    labels = np.array([0, 0, 0, 5, -1, 5])  # a gap in the class numbers, one unlabelled sample
    weights = class_balanced_weights(labels).numpy()
    np.testing.assert_allclose(weights, [1 / 3, 1 / 3, 1 / 3, 1 / 2, 0, 1 / 2])


@pytest.mark.parametrize("length", [1110, 1111])
def test_two_ranks_interleave_into_the_single_process_draw(length: int) -> None:
    labels = np.append(imbalanced_labels(), [2] * (length - sum(COUNTS)))  # an even and an odd length
    for epoch in range(2):
        whole = [index for _, index in keys(labels, epoch)]
        ranks = [keys(labels, epoch, rank, 2) for rank in range(2)]
        assert len(ranks[0]) == len(ranks[1]) == length // 2
        interleaved = [ranks[position % 2][position // 2][1] for position in range(2 * (length // 2))]
        assert interleaved == whole[: 2 * (length // 2)]
        assert all(key[0] == epoch for share in ranks for key in share)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_take_disjoint_positions_of_the_draw(world: int) -> None:
    labels = imbalanced_labels()
    orders = []
    for rank in range(world):
        sampler = BalancedEpochSampler(labels, 7, rank, world)
        sampler.set_epoch(3)
        orders.append(sampler.order)
    total = orders[0].total_size
    positions = [list(range(rank, total, world)) for rank in range(world)]
    assert sum(len(p) for p in positions) == total == len(labels) - len(labels) % world
    assert not set(positions[0]) & set(positions[1])
    draw = epoch_draw(class_balanced_weights(labels), 7, 3)
    for rank, order in enumerate(orders):
        assert list(order) == [int(draw[p]) for p in positions[rank]]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("skip", [0, 1, 37, 554, 555])
def test_resume_continues_the_epoch_exactly(world: int, skip: int) -> None:
    labels = imbalanced_labels()
    for rank in range(world):
        full = keys(labels, 4, rank, world)
        assert keys(labels, 4, rank, world, skip=skip) == full[skip:]


def test_resume_after_an_earlier_epoch_on_the_same_sampler() -> None:
    labels = imbalanced_labels()
    sampler = BalancedEpochSampler(labels, 7, 1, 2)
    sampler.set_epoch(0)
    list(sampler)
    sampler.set_epoch(1, skip_samples=100)
    assert list(sampler) == keys(labels, 1, 1, 2)[100:]
    assert len(sampler) == len(labels) // 2 - 100


def test_the_draw_depends_only_on_seed_and_epoch() -> None:
    labels = imbalanced_labels()
    assert keys(labels, 0) != keys(labels, 1)  # a new draw each epoch
    assert [i for _, i in keys(labels, 0)] != [i for _, i in keys(labels, 1)]
    assert keys(labels, 2) == keys(labels, 2)  # and the same one again, for a resume or another rank
    assert keys(labels, 2, seed=8) != keys(labels, 2, seed=7)


def test_the_epoch_without_set_epoch_is_epoch_zero() -> None:
    labels = imbalanced_labels()
    assert list(BalancedEpochSampler(labels, 7)) == keys(labels, 0)


def test_unlabelled_samples_are_never_drawn() -> None:
    labels = imbalanced_labels().copy()
    labels[::3] = -1
    unlabelled = set(np.flatnonzero(labels < 0).tolist())
    for epoch in range(3):
        drawn = {index for _, index in keys(labels, epoch)}
        assert not drawn & unlabelled
        assert len(drawn) > 100  # many labelled samples were drawn


@pytest.mark.parametrize("labels", [np.full(20, -1), np.array([], dtype=np.int64)])
def test_a_set_without_labels_is_refused(labels: np.ndarray) -> None:
    with pytest.raises(UsageError, match="none of the") as raised:
        BalancedEpochSampler(labels, 7)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("rank", "world"), [(0, 1), (0, 2), (1, 2), (2, 3), (3, 4)])
@pytest.mark.parametrize("length", [1, 7, 1110])
def test_the_order_is_sized_as_epoch_samplers(rank: int, world: int, length: int) -> None:
    labels = imbalanced_labels()[:length]
    balanced = BalancedEpochSampler(labels, 7, rank, world)
    plain = EpochSampler(length, 7, rank, world)
    assert len(balanced.order) == len(plain.order) == length // world
    for sampler in (balanced, plain):
        sampler.order.set_epoch(2)  # the order alone is usable as EpochSampler's is
        sampler.set_epoch(2, skip_samples=min(1, len(sampler.order)))
        assert len(sampler) == len(sampler.order) - min(1, len(sampler.order))
    assert [int(i) for i in balanced.order] == [i for _, i in keys(labels, 2, rank, world)]
    assert all(isinstance(key, tuple) and len(key) == 2 for key in balanced)


def test_the_draw_is_held_as_an_array() -> None:
    labels = imbalanced_labels()
    share = BalancedEpochSampler(labels, 7, 1, 2).order.indices()
    assert isinstance(share, np.ndarray) and share.dtype == np.int64 and len(share) == len(labels) // 2
