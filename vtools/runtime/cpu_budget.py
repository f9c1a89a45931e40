"""The host's CPU budget: loader workers, intra-op and inter-op threads, core binding, host allocator.

Decoding workers, the main process's intra-op threads and the pinned-memory
thread share the host's cores. Left to defaults they collide: torch starts
one intra-op thread per core in every process, and each worker decodes on a
core those threads were counting on. The budget splits the cores on purpose,
from the number this process may use (its affinity, divided among the ranks
torchrun put on this host) and from the device's row in the device table:

- where the model runs on the host (``cpu``), it is the main consumer: all
  cores go to intra-op threads and a few workers (one per 4 cores, at least
  one) decode; a worker sleeps once its prefetch queue is full;
- on an accelerator the host only feeds it: workers get all cores but one
  (at most 8), the main process keeps the rest for collation and launches.

The same reasoning places the next epoch's first batches: an accelerator
validates while the host's workers decode them; where validation itself runs
on the host's cores, decoding then would slow it down about as much as it
saves (docs/performance.md has the measurement), so the workers start once
validation is over, during the checkpoint snapshot.

On a busy host (other processes keeping some of these cores busy as the run starts, vtools/runtime/
host_load.py) the main process runs one intra-op thread fewer per busy core, at least one, and says so;
loader workers are separate processes that the scheduler shares out without stalls, so their count
stays. ``--workers`` and ``--threads`` (or ``OMP_NUM_THREADS``) override either side, workers up to the
cores this process may use: more only queue for them (and torch warns of a stall), so a timm ``args.yaml``'s
``workers: 4`` on a 2-core host runs 2, and says so.
``--bind-cores`` pins each torchrun rank (and the loader workers it forks) to
its own slice of the cores; where the backend binds its own threads from an
environment variable (Ascend's ``CPU_AFFINITY_CONF``, named in the device
table), that variable wins and vtools leaves affinity alone.

The host allocator keeps freed memory: glibc returns large freed blocks to
the system, so every training step page-faults its activations and gradients
back in (docs/performance.md counts them); raising its
trim and mmap thresholds once makes later steps reuse the same memory.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass, replace

import torch

from vtools.errors import UsageError
from vtools.runtime.device import kind_of
from vtools.runtime.host_load import busy_elsewhere

MAX_WORKERS = 8
CORES_PER_CPU_WORKER = 4  # on cpu, one decoding worker per this many cores
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_KEEP_BYTES = 1 << 30


@dataclass(frozen=True)
class CpuBudget:
    """How this process shares the host's cores, and why."""

    cores: int  # cores this process may use
    workers: int  # loader processes
    threads: int  # intra-op threads of the main process
    interop_threads: int
    pin_thread: bool  # the loader's pinned-memory thread (accelerators)
    decode_during_validation: bool = True  # the next epoch is decoded while the device validates
    bound: tuple[int, ...] | None = None  # cores this rank was bound to (--bind-cores)
    affinity: str = ""  # who binds threads to cores, when not vtools
    kept_freed_memory: bool = False
    busy: float = 0.0  # cores other processes kept busy as the run started (when the threads were not given)
    workers_asked: int | None = None  # --workers (or a config's workers) where it was more than the cores

    def describe(self) -> str:
        """One line for the run's start and ``vtools env``."""
        parts = [
            f"{self.cores} core{'s' * (self.cores != 1)}",
            f"{self.workers} loader worker{'s' * (self.workers != 1)}{self._cut()}",
            f"{self.threads} intra-op + {self.interop_threads} inter-op thread"
            f"{'s' * (self.threads + self.interop_threads != 1)}",
        ]
        if self.busy >= 0.5:
            parts[-1] += f" ({self.busy:.1f} of {self.cores} cores busy with other processes at start)"
        if self.pin_thread:
            parts.append("1 pin-memory thread")
        if self.bound is not None:
            parts.append(f"bound to cores {_ranges(self.bound)}")
        if self.affinity:
            parts.append(self.affinity)
        if self.kept_freed_memory:
            parts.append("freed host memory kept")
        return ", ".join(parts)

    def _cut(self) -> str:
        """Why fewer workers than asked: each beyond the process's cores waits for one, and torch warns."""
        if self.workers_asked is None:
            return ""
        return f" (--workers {self.workers_asked} cut to the {self.cores} cores this process may use)"


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask; all cores where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def ranks_on_this_host() -> tuple[int, int]:
    """(local rank, processes on this host) as torchrun sets them; (0, 1) for a single process, and where
    no LOCAL_WORLD_SIZE says how many share the cores (an srun that bound each task to its own cores)."""
    if "LOCAL_WORLD_SIZE" not in os.environ:
        return 0, 1
    return int(os.environ.get("LOCAL_RANK", "0")), max(1, int(os.environ["LOCAL_WORLD_SIZE"]))


def rank_slice(cores: list[int], local_rank: int, local_ranks: int) -> list[int]:
    """This rank's disjoint, contiguous share of ``cores`` (the last ranks absorb no remainder: equal
    shares, so no rank gets more decoding power than another)."""
    share = len(cores) // local_ranks
    if share == 0:
        raise UsageError(f"--bind-cores: {local_ranks} processes on this host but only {len(cores)} cores")
    return cores[local_rank * share : (local_rank + 1) * share]


def plan(
    device_type: str, cores: int, workers: int | None = None, threads: int | None = None, busy: float = 0.0
) -> CpuBudget:
    """The split of ``cores`` between loader workers and the main process for a device type, with ``busy``
    of them taken by other processes."""
    on_host = kind_of(device_type).computes_on_host
    asked = workers if workers is not None and workers > cores else None
    if workers is None:
        workers = max(1, cores // CORES_PER_CPU_WORKER) if on_host else cores - 1
        workers = max(1, min(MAX_WORKERS, workers))
    workers = min(workers, cores)  # more would only queue for a core (torch warns and may stall)
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        if env.isdigit() and int(env) > 0:
            threads = int(env)
        else:
            threads = min(cores if on_host else cores - workers, int(cores - busy + 0.5))
    return CpuBudget(
        cores=cores,
        workers=workers,
        threads=max(1, threads),
        interop_threads=1,
        pin_thread=not on_host and kind_of(device_type).pinned_host_memory and workers > 0,
        decode_during_validation=not on_host,
        busy=busy,
        workers_asked=asked,
    )


def setup_cpu_budget(
    device: torch.device, workers: int | None = None, threads: int | None = None, bind: bool = False
) -> CpuBudget:
    """Decide the budget for ``device``, bind this rank's cores when asked, and apply it to torch."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be 1 or more, got {threads}")
    cores = usable_cores()
    local_rank, local_ranks = ranks_on_this_host()
    affinity_env = kind_of(device.type).affinity_env
    backend_binds = bool(affinity_env) and os.environ.get(affinity_env, "0").split(",")[0] not in ("", "0")
    bound = None
    if bind and not backend_binds:
        bound = tuple(rank_slice(cores, local_rank, local_ranks))
        os.sched_setaffinity(0, bound)
        share = len(bound)
    else:
        share = max(1, len(cores) // local_ranks)
    budget = plan(device.type, share, workers, threads, _busy_share(threads, cores, local_ranks))
    _set_threads(budget.threads, budget.interop_threads)
    affinity = f"{affinity_env}={os.environ[affinity_env]} binds the backend's threads" if backend_binds else ""
    return replace(budget, bound=bound, affinity=affinity, kept_freed_memory=keep_freed_host_memory())


def _busy_share(threads: int | None, cores: list[int], local_ranks: int) -> float:
    """Cores of this process's share that other processes keep busy; 0 where the thread count is given,
    and where ranks of one job share the host (they start together: each would count its siblings'
    start-up, bound or not, as their imports ran before any binding)."""
    if threads is not None or os.environ.get("OMP_NUM_THREADS", "").isdigit() or local_ranks > 1:
        return 0.0
    busy = busy_elsewhere(cores)
    return 0.0 if busy is None else round(busy, 1)


def _set_threads(threads: int, interop_threads: int) -> None:
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != interop_threads:
        try:
            torch.set_num_interop_threads(interop_threads)
        except RuntimeError:  # inter-op work already ran in this process (a second run in one process)
            pass


def keep_freed_host_memory() -> bool:
    """Stop glibc from handing large freed blocks back to the system (see the module docstring);
    returns whether it applied (glibc only)."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)) and bool(libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES))


def return_freed_host_memory() -> bool:
    """Hand the memory freed so far back to the system (glibc only; returns whether it ran). For after
    a burst of many small short-lived objects in several threads (a scan of a large folder), whose
    freed space glibc keeps in each thread's own pool, where later steps would never reuse it."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _ranges(cores: tuple[int, ...]) -> str:
    """0,1,2,3,8 -> '0-3,8'."""
    spans: list[list[int]] = []
    for core in cores:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)
