"""The attempt number the ranks of a restarted torchrun group agree on, over a real TCPStore that still
holds a dead attempt's keys (as torchrun's agent store does); the restart itself: tests/scripts/test_recovery.py."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.conftest import free_port
from vtools.errors import RunFailed
from vtools.runtime.attempt_store import attempt_store, under_agent_store


def _join(world_size: int, port: int, timeout: float = 20.0, late: float = 0.0) -> list[int]:
    """Every rank of one attempt joining (threads, each with its own client; ranks other than 0 ``late``
    seconds after it); their numbers."""
    numbers: list[int | BaseException] = [0] * world_size

    def join(rank: int) -> None:
        try:
            numbers[rank] = attempt_store(rank, world_size, timedelta(seconds=timeout))[1]
        except BaseException as err:
            numbers[rank] = err

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(world_size)]
    threads[0].start()
    time.sleep(late)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    for number in numbers:
        if isinstance(number, BaseException):
            raise number
    return numbers


@pytest.fixture
def agent_store(monkeypatch: pytest.MonkeyPatch) -> dist.TCPStore:
    """A store served apart from the ranks, as torchrun's agent serves it, named in their environment."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=20))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    return server


def test_each_attempt_gets_a_new_number_that_every_rank_agrees_on(agent_store: dist.TCPStore) -> None:
    assert under_agent_store()
    port = int(os.environ["MASTER_PORT"])
    assert _join(3, port) == [1, 1, 1]
    assert _join(3, port) == [2, 2, 2]  # the first attempt's nonces, answers and confirmations still there
    assert _join(2, port) == [3, 3]  # an elastic attempt with fewer ranks


def test_rank_0_waits_for_this_attempts_ranks_not_the_dead_attempts(agent_store: dist.TCPStore) -> None:
    """Rank 0 of the second attempt starts first and finds the first attempt's confirmations: it must
    wait for ranks that confirm its own number (else they would wait for an answer forever)."""
    port = int(os.environ["MASTER_PORT"])
    assert _join(3, port) == [1, 1, 1]
    assert _join(3, port, timeout=5, late=0.5) == [2, 2, 2]


def test_the_namespaces_of_two_attempts_do_not_share_keys(agent_store: dist.TCPStore) -> None:
    port = int(os.environ["MASTER_PORT"])
    first, _ = attempt_store(0, 1, timedelta(seconds=5))
    first.set("rank_1_address", "dead")
    second, _ = attempt_store(0, 1, timedelta(seconds=5))
    assert not second.check(["rank_1_address"]) and first.check(["rank_1_address"])
    assert port == int(os.environ["MASTER_PORT"])


def test_a_rank_that_never_joins_ends_the_wait_at_the_timeout(agent_store: dist.TCPStore) -> None:
    with pytest.raises(RunFailed, match=r"rank\(s\) \[1\] did not join attempt 1"):
        attempt_store(0, 2, timedelta(seconds=1))


def test_without_torchruns_agent_the_store_is_left_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert not under_agent_store()
