"""How much of the host's cores other processes are using, so the cpu budget does not oversubscribe them.

Intra-op threads meet at the end of every parallel operation. On a core another process keeps busy, a
thread runs only when the scheduler gives it a slice, and every operation waits for the slowest thread:
two quick starts at once on 2 cores, each with 2 spinning threads, took over 10 minutes where one alone
takes 30 s (docs/performance.md, "A busy host"). Two defences, both before any model work:

- threads that wait for work sleep instead of spinning (OpenMP's ``OMP_WAIT_POLICY=PASSIVE``, set before
  torch loads its OpenMP runtime unless the user chose a policy): a waiting thread then leaves its core
  to whoever needs it;
- the budget counts the cores that other processes kept busy while this one started, read from the
  kernel's per-core counters (``/proc/stat``) between the guarded torch import and the budget, less this
  process's own CPU time, and runs one intra-op thread fewer per busy core.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

LEAST_WINDOW_S = 0.25  # shorter windows are topped up with a sleep: a tick is 10 ms per core
_IDLE_FIELDS = (3, 4)  # idle and iowait in a /proc/stat cpu line's counters
_STEAL_AND_AFTER = 8  # guest time (fields 8 and 9) is already counted in user time


@dataclass(frozen=True)
class CoreClock:
    """The kernel's per-core time counters and this process's own CPU time, at one moment."""

    busy_ticks: dict[int, int]  # core -> ticks spent on anything but idling
    own_seconds: float  # CPU time of this process and the children it waited for
    at: float  # time.monotonic()


_start: CoreClock | None = None


def quiet_waiting_threads() -> None:
    """Make OpenMP threads sleep while they wait (see the module docstring); the user's policy wins. Runs
    before torch is imported: the OpenMP runtime reads the variable once, when it loads."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def mark_start() -> None:
    """Start the window over which :func:`busy_elsewhere` measures (the first call counts)."""
    global _start
    if _start is None:
        _start = read_clock()


def read_clock() -> CoreClock | None:
    """The counters now; None where the kernel does not publish them (not Linux)."""
    try:
        lines = open("/proc/stat", encoding="ascii").read().splitlines()  # noqa: SIM115 (one read)
    except OSError:
        return None
    busy = {}
    for line in lines:
        name, *counters = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(value) for value in counters[:_STEAL_AND_AFTER]]
            busy[int(name[3:])] = sum(ticks) - sum(ticks[i] for i in _IDLE_FIELDS)
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return CoreClock(busy, sum(use.ru_utime + use.ru_stime for use in usage), time.monotonic())


def busy_elsewhere(cores: list[int]) -> float | None:
    """How many of ``cores`` other processes kept busy since :func:`mark_start` (or over the next
    LEAST_WINDOW_S where nothing marked a start, as in the Python API); None where it cannot be read."""
    start = _start if _start is not None else read_clock()
    if start is None:
        return None
    time.sleep(max(0.0, LEAST_WINDOW_S - (time.monotonic() - start.at)))
    now = read_clock()
    return None if now is None else busy_between(start, now, cores)


def busy_between(start: CoreClock, end: CoreClock, cores: list[int]) -> float:
    """The cores of ``cores`` kept busy between two readings by anything but this process, on average."""
    ticks = sum(end.busy_ticks.get(core, 0) - start.busy_ticks.get(core, 0) for core in cores)
    others = ticks / os.sysconf("SC_CLK_TCK") - (end.own_seconds - start.own_seconds)
    return min(float(len(cores)), max(0.0, others / max(end.at - start.at, 1e-9)))
