"""A store namespace of its own for each attempt of a torchrun job, so that a restarted group can form.

Under torchrun the workers' rendezvous store is the agent's (``TORCHELASTIC_USE_AGENT_STORE``), and it
outlives the workers: when ``--max-restarts`` (or an elastic membership change) starts a new attempt,
the keys the dead attempt's ranks wrote are still there. torch 2.14's ``env://`` rendezvous uses the
same key names every attempt, so a restarted rank reads a dead rank's address and the group never
forms (gloo waits in ``connectFullMesh`` until its timeout; tests/scripts/test_recovery.py restarts one).
``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: each agent counts its own restarts.

So the ranks agree on an attempt number through the store itself, in a way stale keys cannot fool: rank
0 draws the next number from an atomic counter; every other rank posts a nonce of its own process, rank 0
answers each nonce with the number, and each rank confirms it. Rank 0 goes on once every rank has
confirmed this attempt's number (an old confirmation holds a smaller one). The process group then lives
under ``vtools/attempt/<number>/``.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import torch.distributed as dist

from vtools.errors import RunFailed

POLL_SECONDS = 0.02


def under_agent_store() -> bool:
    """Whether torchrun's agent hosts this job's store (it then outlives the job's attempts)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and "MASTER_ADDR" in os.environ


def attempt_store(rank: int, world_size: int, timeout: timedelta) -> tuple[dist.Store, int]:
    """The agent's store under a namespace of this attempt's own, and the attempt's number (1, 2, ...)."""
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    board = dist.PrefixStore("vtools/attempts/", base)
    deadline = time.monotonic() + timeout.total_seconds()
    attempt = _number_the_ranks(board, world_size, deadline) if rank == 0 else _learn_number(board, rank, deadline)
    return dist.PrefixStore(f"vtools/attempt/{attempt}/", base), attempt


def _number_the_ranks(board: dist.Store, world_size: int, deadline: float) -> int:
    """Rank 0: draw this attempt's number and answer every rank's nonce with it until all confirm."""
    attempt = board.add("count", 1)
    waiting = set(range(1, world_size))
    while waiting:
        for rank in sorted(waiting):
            if board.check([f"nonce/{rank}"]):
                board.set(f"answer/{rank}", f"{board.get(f'nonce/{rank}').decode()} {attempt}")
            if board.check([f"confirmed/{rank}"]) and board.get(f"confirmed/{rank}").decode() == str(attempt):
                waiting.discard(rank)
        if waiting:
            _pause(deadline, f"rank(s) {sorted(waiting)} did not join attempt {attempt}")
    return attempt


def _learn_number(board: dist.Store, rank: int, deadline: float) -> int:
    """Any other rank: post a nonce, take the number rank 0 answers it with, confirm it."""
    nonce = uuid.uuid4().hex
    board.set(f"nonce/{rank}", nonce)
    while True:
        if board.check([f"answer/{rank}"]):
            echoed, _, number = board.get(f"answer/{rank}").decode().partition(" ")
            if echoed == nonce:
                board.set(f"confirmed/{rank}", number)
                return int(number)
        _pause(deadline, "rank 0 did not number this attempt")


def _pause(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise RunFailed(f"the ranks could not agree on this attempt within --dist-timeout: {what}")
    time.sleep(POLL_SECONDS)
