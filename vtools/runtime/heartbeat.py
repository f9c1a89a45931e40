"""A heartbeat between the ranks of a distributed run, so that a rank that stops answering ends the job in one line.

Without it, a rank that stops (SIGSTOP, a hung device, a frozen node) leaves the others blocked in their next
collective until the backend's timeout (NCCL's and HCCL's are 10-30 minutes), after which each prints a stack
trace that names no rank. Here each rank runs a daemon thread that, every :func:`beat_period`, publishes its beat
(a counter, its host, pid and last logged step) in the rendezvous store and reads the beat of the next rank. The
ranks watch each other in a ring: the store's load grows with the ranks, not with their square, and a stopped
rank has exactly one watcher, so exactly one line reports it. A beat that has not changed for ``--dist-timeout``
seconds of the watcher's own monotonic clock (clocks of different hosts are never compared) ends the job: the
watcher prints one line naming the rank, marks the job ended in the store (every other rank's thread sees the mark
within a period and leaves quietly), kills the stopped rank when it is a sibling on this host, and leaves with
:data:`EXIT_SILENT_RANK`. A store that stops answering counts as silence of the host it runs on (rank 0's: the
torchrun agent of node 0, or rank 0 itself under srun); its calls are waited for at most two beats
(:class:`StoreCall`), so the thread never hangs.

The heartbeat tells whether a process still runs, not whether training progresses: a rank waiting in a
collective beats on. A collective that never completes among live ranks is the process group's timeout's job
(:func:`collective_timeout`, a few beats longer than the heartbeat's, so that a stopped rank is named first).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, NoReturn

import torch.distributed as dist

from vtools.errors import EXIT_RUN_FAILED

EXIT_SILENT_RANK = EXIT_RUN_FAILED  # the run failed on its own (the input was fine): exit 3, as RunFailed
PREFIX = "vtools/heartbeat"
RESUME_HINT = "continue with --resume auto (recovery checkpoints: --recovery-interval)"


def beat_period(timeout: float) -> float:
    """Seconds between beats: a twentieth of the timeout, within 0.5-10 s (often enough to be named soon
    after the timeout, rarely enough to cost nothing)."""
    return min(10.0, max(0.5, timeout / 20))


def store_op_timeout(timeout: float) -> float:
    """How long one store call may take before it counts as the store's silence: two beats."""
    return 2 * beat_period(timeout)


def collective_timeout(timeout: float) -> float:
    """The process group's (and the device's) collective timeout for ``--dist-timeout``: four beats longer,
    so that when a rank stops, the heartbeat names it before a collective times out without a name."""
    return timeout + 4 * beat_period(timeout)


@dataclass(frozen=True)
class Beat:
    """What one rank publishes each period: ``count`` changes every beat; ``left`` once it has left the
    heartbeat (finished or failed on its own), when its silence means nothing."""

    count: int
    host: str
    pid: int
    epoch: int | None = None
    step: int | None = None
    left: bool = False
    device: str | None = None  # its device, and the card behind it (``npu:1 (card 5)``)

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def decode(cls, data: bytes) -> Beat:
        return cls(**json.loads(data))

    def step_text(self) -> str:
        return "none logged yet" if self.epoch is None else f"epoch {self.epoch} step {self.step}"


@dataclass(frozen=True)
class Ending:
    """How this rank leaves: the line to print (None: another rank printed it), and a stopped sibling
    process on this host to kill first."""

    line: str | None
    stuck_pid: int | None = None
    code: int = EXIT_SILENT_RANK


class StoreCall:
    """A store call on a daemon thread of its own, waited for with a timeout. torch's TCPStore client waits
    for the server's answer without a limit (its timeout only bounds waiting for a key): a store host that
    is stopped, not gone, would hold the caller for good. The daemon thread it holds then never blocks the
    process's exit."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._work, self._done = work, threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="vtools-heartbeat-store", daemon=True).start()

    def _end_process(self, ending: Ending) -> None:
        end_process(ending, self._stderr_fd)

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as error:  # handed to the waiting thread
            self._error = error
        finally:
            self._done.set()

    def finished(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float) -> Any:
        """The call's value; its error raised here; TimeoutError while it has not answered."""
        if not self._done.wait(timeout):
            raise TimeoutError
        if self._error is not None:
            raise self._error
        return self._value

    def result_or_none(self, timeout: float) -> Any:
        """The call's value, or None where it failed or did not answer in time."""
        try:
            return self.result(timeout)
        except (TimeoutError, dist.DistError, RuntimeError):
            return None


class Heartbeat:
    """This rank's beat and its watch over the next rank, as a context manager around the training.

    ``store`` is any torch.distributed store (the rendezvous store in a run, :func:`rendezvous_store`; a
    HashStore in tests); ``clock`` a monotonic clock; ``end`` what ends this process (:func:`end_process`).
    :meth:`beat` is one period's work, which the thread repeats and tests call directly."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        timeout: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        end: Callable[[Ending], None] | None = None,
        host: str | None = None,
        pid: int | None = None,
        device: str | None = None,
    ) -> None:
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.device = device
        self.period = beat_period(timeout)
        self.watched = (rank + 1) % world_size
        self.clock, self.end = clock, end or self._end_process
        self._stderr_fd = 2  # the run's stderr as it was when the heartbeat started (see __enter__)
        self.host, self.pid = host or socket.gethostname(), pid or os.getpid()
        self._position: tuple[int, int] | None = None
        self._count = 0
        started = clock()
        self._watched_beat: Beat | None = None
        self._watched_changed = started  # a rank that never beats is silent from the start
        self._store_answered = started
        self._pending: StoreCall | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def progress(self, epoch: int, step: int) -> None:
        """Record the last step this rank reached (one attribute set: the loop may call it every update)."""
        self._position = (epoch, step)

    def beat(self) -> Ending | None:
        """Publish this rank's beat, look for the job's end mark and at the watched rank's beat; how this
        rank must leave, or None while all is well. Waits at most :func:`store_op_timeout` for the store: a
        call it has not answered is waited for again at the next beat, never sent twice."""
        if self._pending is None:
            self._pending = StoreCall(self._exchange)
        try:
            answer = self._pending.result(store_op_timeout(self.timeout))
        except TimeoutError:  # still in flight: the store is silent so far
            return self._store_silence(self.clock())
        except (dist.DistError, RuntimeError):  # a closed connection, a refused call: as silent
            self._pending = None
            return self._store_silence(self.clock())
        self._pending = None
        now = self.clock()
        self._store_answered = now
        ended, beat = answer
        if ended:
            return Ending(None)
        if beat != self._watched_beat:
            self._watched_beat, self._watched_changed = beat, now
        if beat is not None and beat.left:
            return None
        silent = now - self._watched_changed
        if silent < self.timeout:
            return None
        return self._declare_stopped(beat, silent)

    def _exchange(self) -> tuple[bool, Beat | None]:
        """One period's store calls: publish this rank's beat; whether the job was ended, and the watched
        rank's beat (None before its first)."""
        self._publish(left=False)
        if self.store.check([_END_KEY]):
            return True, None
        watched = _rank_key(self.watched)
        if self._watched_beat is None and not self.store.check([watched]):
            return False, None  # a get would wait for the key to appear
        return False, Beat.decode(self.store.get(watched))

    def _publish(self, left: bool) -> None:
        self._count += 1
        epoch, step = self._position or (None, None)
        beat = Beat(self._count, self.host, self.pid, epoch, step, left, self.device)
        self.store.set(_rank_key(self.rank), beat.encode())

    def _declare_stopped(self, beat: Beat | None, silent: float) -> Ending:
        """The watched rank is stopped: mark the job ended for the others and say which rank it is."""
        # best effort: where the mark does not arrive, the others find the store, or this rank, silent
        StoreCall(lambda: self.store.set(_END_KEY, str(self.watched))).result_or_none(store_op_timeout(self.timeout))
        if beat is None:
            who = f"rank {self.watched} (never beat)"
        else:
            on = f", {beat.device}" if beat.device else ""
            who = f"rank {self.watched} (host {beat.host}, pid {beat.pid}{on})"
        step = beat.step_text() if beat else "none logged yet"
        line = f"{who} has not answered for {silent:.0f} s (last step: {step}): ending the job; {RESUME_HINT}"
        sibling = beat is not None and beat.host == self.host
        return Ending(line, stuck_pid=beat.pid if sibling else None)

    def _store_silence(self, now: float) -> Ending | None:
        """The store did not answer. After the timeout the job ends; the watcher of rank 0 (whose host
        runs the store) says so, the others leave quietly: none of them can reach the others to agree."""
        silent = now - self._store_answered
        if silent < self.timeout:
            return None
        if self.watched != 0:
            return Ending(None)
        beat = self._watched_beat
        host = f"host {beat.host}" if beat else "its host"
        step = beat.step_text() if beat else "none logged yet"
        line = (
            f"the rendezvous store (on rank 0's host, {host}) has not answered for {silent:.0f} s (rank 0's last "
            f"step: {step}): ending the job; {RESUME_HINT}"
        )
        return Ending(line)

    def _end_process(self, ending: Ending) -> None:
        end_process(ending, self._stderr_fd)

    def _run(self) -> None:
        while True:
            ending = self.beat()
            if ending is not None:
                self.end(ending)
                return
            if self._stop.wait(self.period):
                return

    def __enter__(self) -> Heartbeat:
        global _active
        # the stderr of now: a tee the run puts on descriptor 2 later forwards through a thread, which
        # the os._exit that ends a stopped job would not wait for (the line naming the rank would be lost)
        self._stderr_fd = os.dup(2)
        self._thread = threading.Thread(target=self._run, name="vtools-heartbeat", daemon=True)
        self._thread.start()
        _active = self
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """Stop beating and say this rank has left, so that its watcher does not take its silence for a
        stop (a rank that finished first, or failed with its own message)."""
        global _active
        _active = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=store_op_timeout(self.timeout) * 3 + self.period)
        if self._stderr_fd != 2 and (self._thread is None or not self._thread.is_alive()):
            os.close(self._stderr_fd)
            self._stderr_fd = 2
        if self._pending is None or self._pending.finished():  # the store answers: say so there
            StoreCall(lambda: self._publish(left=True)).result_or_none(store_op_timeout(self.timeout))


_END_KEY = "end"
_active: Heartbeat | None = None


def _rank_key(rank: int) -> str:
    return f"rank/{rank}"


def report_progress(epoch: int, step: int) -> None:
    """The training's last step, for the line that names a stopped rank (a no-op without a heartbeat)."""
    if _active is not None:
        _active.progress(epoch, step)


def rendezvous_store(timeout: float, namespace: str) -> dist.Store:
    """A connection of this process's own to the store the ranks met at (``MASTER_ADDR:MASTER_PORT``: the
    torchrun agent's store, or rank 0's under srun), under ``namespace``. Its own connection, not the process
    group's (reachable only through the private ``_get_default_store``): its calls carry the short
    :func:`store_op_timeout` without shortening the process group's."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=store_op_timeout(timeout)),
    )
    return dist.PrefixStore(f"{PREFIX}/{namespace}/", store)


def rank_heartbeat(
    rank: int, world_size: int, timeout: float, device: str | None = None
) -> AbstractContextManager[Heartbeat | None]:
    """The heartbeat of a distributed run's rank, to wrap its training in (nothing for a single process:
    nobody waits for it); ``device``: this rank's, as the line naming a stopped rank gives it (its card). Call
    it on every rank once the process group exists: the ranks agree on a
    namespace of this group's own (rank 0's random name, broadcast), because torchrun's store outlives a
    group that ``--max-restarts`` replaces, and the agents of a job do not count their restarts alike."""
    if world_size <= 1:
        return nullcontext()
    namespace = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(namespace, src=0)
    return Heartbeat(rendezvous_store(timeout, str(namespace[0])), rank, world_size, timeout, device=device)


def end_process(ending: Ending, stderr_fd: int = 2) -> NoReturn:
    """Print the ending's line, kill the stopped sibling, and leave at once: the main thread may be blocked
    in a collective that would never return, so no cleanup of its can run."""
    if ending.line:
        prog = os.path.basename(sys.argv[0] or "vtools")
        sys.stderr.flush()
        os.write(stderr_fd, f"{prog}: error: {ending.line}\n".encode(errors="backslashreplace"))
    if ending.stuck_pid is not None:
        kill_stopped_sibling(ending.stuck_pid)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(ending.code)


def kill_stopped_sibling(pid: int) -> None:
    """SIGKILL a stopped rank that shares this process's parent (a worker of the same torchrun agent or
    slurmstepd). A stopped process cannot act on SIGTERM, so torchrun, once this rank leaves, would send it
    SIGTERM and wait its 30 s grace before SIGKILL, and srun would wait on it for good. The parent check
    keeps a reused pid from being killed."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):  # gone, or not Linux
        return
    if parent == os.getppid():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
