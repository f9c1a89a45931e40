"""The heartbeat between ranks (vtools/runtime/heartbeat.py), on real torch.distributed stores in one process:
a rank that stops is named by its one watcher after the timeout, the others leave quietly, a rank that left is
no stop, and a store that stops answering ends the job without hanging. Whole torchrun jobs with a SIGSTOPped
rank: tests/scripts/test_hang.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from vtools.runtime.distributed import set_device_collective_timeouts
from vtools.runtime.heartbeat import (
    Ending,
    Heartbeat,
    beat_period,
    collective_timeout,
    report_progress,
    store_op_timeout,
)

pytestmark = pytest.mark.cpu_only(reason="store and thread logic; no device involved")


class FakeClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ranks(
    store: dist.Store, world_size: int, timeout: float, clock: FakeClock, hosts: list[str], cards: bool = False
) -> list[Heartbeat]:
    """One Heartbeat per rank on ``store``; rank r runs on ``hosts[r]`` as pid 100 + r (with ``cards``, on
    npu:r, card 4 + r, as under ASCEND_RT_VISIBLE_DEVICES=4,5,...)."""
    return [
        Heartbeat(
            store,
            rank,
            world_size,
            timeout,
            clock=clock,
            host=hosts[rank],
            pid=100 + rank,
            device=f"npu:{rank} (card {4 + rank})" if cards else None,
        )
        for rank in range(world_size)
    ]


def beat_until(beating: list[Heartbeat], clock: FakeClock, until: float) -> dict[int, Ending]:
    """Each rank of ``beating`` beats once a second up to ``until``; the endings they return, by rank."""
    endings: dict[int, Ending] = {}
    while clock.now < until:
        clock.now += 1.0
        for heartbeat in beating:
            ending = heartbeat.beat()
            if ending is not None and heartbeat.rank not in endings:
                endings[heartbeat.rank] = ending
        if endings:
            return endings
    return endings


def test_a_stopped_rank_is_named_by_its_watcher_after_the_timeout() -> None:
    clock = FakeClock()
    zero, one = ranks(dist.HashStore(), 2, 20.0, clock, ["node-a", "node-b"])
    one.progress(0, 7)
    assert one.beat() is None and zero.beat() is None  # t = 0: rank 1's last beat, which rank 0 sees
    endings = beat_until([zero], clock, until=40.0)
    assert clock.now == 20.0, "named later (or earlier) than the timeout after its last beat"
    ending = endings[0]
    assert ending.line == (
        "rank 1 (host node-b, pid 101) has not answered for 20 s (last step: epoch 0 step 7): ending the job; "
        "continue with --resume auto (recovery checkpoints: --recovery-interval)"
    )
    assert ending.stuck_pid is None, "a rank on another host cannot be killed from here"
    assert ending.code == 3
    clock.now += 1.0
    assert one.beat() == Ending(None), "the stopped rank, if it comes back, leaves without a second line"


def test_a_stopped_rank_is_named_with_its_card() -> None:
    """Behind a visible-devices list the card is what an operator looks for (npu-smi lists cards)."""
    clock = FakeClock()
    zero, one = ranks(dist.HashStore(), 2, 20.0, clock, ["node-a", "node-b"], cards=True)
    assert one.beat() is None and zero.beat() is None
    ending = beat_until([zero], clock, until=40.0)[0]
    assert ending.line.startswith("rank 1 (host node-b, pid 101, npu:1 (card 5)) has not answered for 20 s")


def test_a_stopped_sibling_on_this_host_is_marked_for_killing() -> None:
    clock = FakeClock()
    zero, one = ranks(dist.HashStore(), 2, 5.0, clock, ["node-a", "node-a"])
    one.beat(), zero.beat()
    ending = beat_until([zero], clock, until=20.0)[0]
    assert ending.stuck_pid == 101
    assert "rank 1 (host node-a, pid 101)" in ending.line and "last step: none logged yet" in ending.line


def test_exactly_one_rank_names_the_stopped_one_and_the_others_leave_quietly() -> None:
    """Ranks watch the next rank in a ring: rank 2 stopped is named by rank 1 alone; rank 0 sees the end mark."""
    clock = FakeClock()
    beats = ranks(dist.HashStore(), 4, 10.0, clock, ["h0", "h0", "h1", "h1"])
    for heartbeat in beats:
        heartbeat.beat()
    live = [beats[0], beats[1], beats[3]]
    endings = beat_until(live, clock, until=30.0)
    assert [rank for rank, ending in endings.items() if ending.line] == [1], endings
    assert endings[1].line.startswith("rank 2 (host h1, pid 102)")
    clock.now += 1.0
    assert beats[0].beat() == Ending(None) and beats[3].beat() == Ending(None)


def test_a_rank_that_left_is_not_taken_for_a_stopped_one() -> None:
    """A rank that finished first (or failed with its own message) says so when it leaves."""
    clock = FakeClock()
    zero, one = ranks(dist.HashStore(), 2, 5.0, clock, ["h", "h"])
    zero.beat(), one.beat()
    one.__exit__(None, None, None)
    assert beat_until([zero], clock, until=60.0) == {}


def test_a_rank_that_never_beats_is_named_after_the_timeout() -> None:
    clock = FakeClock()
    zero, _ = ranks(dist.HashStore(), 2, 5.0, clock, ["h", "h"])
    endings = beat_until([zero], clock, until=20.0)
    assert clock.now == 5.0 and endings[0].line.startswith("rank 1 (never beat) has not answered for 5 s")


def test_the_thread_ends_the_process_and_reports_the_logged_step() -> None:
    """The context manager's thread beats on a real TCPStore and calls ``end`` once rank 1 falls silent;
    report_progress reaches the heartbeat that runs."""
    timeout = 1.0
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ended: list[Ending] = []
    done = threading.Event()

    def end(ending: Ending) -> None:
        ended.append(ending)
        done.set()

    zero = Heartbeat(server, 0, 2, timeout, end=end, host="h", pid=100)
    one = Heartbeat(server, 1, 2, timeout, host="other", pid=101)
    one.beat()  # then silent, as a stopped process is
    started = time.monotonic()
    with zero:
        report_progress(2, 5)
        assert done.wait(timeout + 3 * beat_period(timeout) + 5), "the watchdog never fired"
    took = time.monotonic() - started
    assert timeout <= took < timeout + 3 * beat_period(timeout) + 2, took
    assert len(ended) == 1 and ended[0].line.startswith("rank 1 (host other, pid 101) has not answered")
    assert server.check(["end"]), "the other ranks are told to leave"
    report_progress(0, 0)  # no heartbeat runs now: a no-op


class FreezableRelay:
    """A TCP relay in front of a real store that can stop relaying: the store's host frozen (SIGSTOP)
    while its connections stay open, so calls neither fail nor answer."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
                while self.frozen.is_set():
                    time.sleep(0.05)
                if not data:
                    return
                sink.sendall(data)
            except OSError:
                return


def test_a_silent_store_ends_the_job_without_hanging() -> None:
    """Store calls carry a short timeout: each beat returns within it, and after ``timeout`` of silence the
    watcher of rank 0 (whose host runs the store) says so; the other rank leaves quietly."""
    timeout = 1.0
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    relay = FreezableRelay(server.port)
    clock = FakeClock()
    beats = []
    for rank in range(2):
        client = dist.TCPStore(
            "127.0.0.1",
            relay.port,
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=store_op_timeout(timeout)),
        )
        beats.append(Heartbeat(client, rank, 2, timeout, clock=clock, host="h", pid=100 + rank))
    zero, one = beats
    assert zero.beat() is None and one.beat() is None
    relay.frozen.set()
    try:
        started = time.monotonic()
        assert one.beat() is None, "one silent call is not yet the timeout"
        assert time.monotonic() - started < store_op_timeout(timeout) + 2, "a store call outlived its timeout"
        clock.now += timeout
        ending = one.beat()
        assert ending is not None and ending.line.startswith(
            "the rendezvous store (on rank 0's host, host h) has not answered for 1 s (rank 0's last step: none"
        ), ending
        assert zero.beat() == Ending(None)
    finally:
        relay.frozen.clear()
        relay.listener.close()


def test_collective_timeouts_follow_the_dist_timeout() -> None:
    assert beat_period(20) == 1.0 and beat_period(2) == 0.5 and beat_period(1800) == 10.0
    assert collective_timeout(20) == 24.0 and collective_timeout(1800) == 1840.0


def test_the_device_collective_timeout_comes_from_the_table_and_leaves_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "unset below, restored after the test")
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT")
    assert set_device_collective_timeouts("npu", 24.2) == {"HCCL_EXEC_TIMEOUT": "25"}
    assert set_device_collective_timeouts("cpu", 24.2) == {}
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "3600")
    assert set_device_collective_timeouts("npu", 24.2) == {}
    assert os.environ["HCCL_EXEC_TIMEOUT"] == "3600"
