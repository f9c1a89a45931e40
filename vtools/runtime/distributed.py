"""torch.distributed set-up for torchrun and srun, the same on every device type.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; the device layer picks the
device from LOCAL_RANK and the collective backend from the device type
(hccl on npu, nccl on cuda, gloo on cpu, ...).

``srun python train.py`` (SLURM, one task per device, no torchrun) sets
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID instead: :func:`adopt_srun_launch`
reads them as timm does and exports torchrun's names before the device is
resolved, so the rest runs as under torchrun (env:// rendezvous at the
MASTER_ADDR / MASTER_PORT the job script exports).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.utils.data import Sampler

from vtools.errors import UsageError
from vtools.runtime.attempt_store import attempt_store, under_agent_store
from vtools.runtime.device import chip_family, dist_backend, kind_of
from vtools.runtime.heartbeat import collective_timeout

MASTER_EXAMPLE = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) MASTER_PORT=29500'


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return (_launch_number("WORLD_SIZE") or 1) > 1


# the variables timm's world_info_from_env reads, in its order: torchrun's, MPI's PMI_*, SLURM's, Open MPI's
LAUNCH_VARIABLES = {
    "local_rank": ("LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "rank": ("RANK", "PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"),
    "world_size": ("WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"),
}


def _launch_number(name: str) -> int | None:
    """A launcher's variable as a whole number (None when unset); anything else stops in one line, where
    timm would fail with a traceback."""
    if name not in os.environ:
        return None
    text = os.environ[name].strip()
    if not text.isdigit() or (name in LAUNCH_VARIABLES["world_size"] and int(text) == 0):
        least = "1 or more" if name in LAUNCH_VARIABLES["world_size"] else "0 or more"
        raise UsageError(
            f"{name}={os.environ[name]!r} is not a whole number of {least}: the launcher (srun, torchrun, mpirun) "
            f"sets it; unset it, or start the script through the launcher"
        )
    return int(text)


def srun_tasks() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) of this task when srun started more than one and torchrun did not
    (RANK / WORLD_SIZE unset); None otherwise. Read as timm's ``world_info_from_env`` reads them
    (:data:`LAUNCH_VARIABLES`), each checked first: a rank outside the world would wait for the missing ranks
    forever."""
    from timm.utils.distributed import world_info_from_env

    if "SLURM_PROCID" not in os.environ or "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return None
    used = {
        role: next((name for name in names if _launch_number(name) is not None), None)
        for role, names in LAUNCH_VARIABLES.items()
    }
    local_rank, rank, world_size = world_info_from_env()
    for role, value in (("rank", rank), ("local_rank", local_rank)):  # one task of one too: SLURM_PROCID=1 of 1
        if used[role] is not None and used["world_size"] is not None and value >= world_size:
            raise UsageError(
                f"{used[role]}={value} is not below {used['world_size']}={world_size} (ranks run from 0 to "
                f"{world_size - 1}): this process would wait forever for ranks that do not exist; these variables "
                "come from srun: start the script through srun rather than setting them by hand"
            )
    if world_size <= 1:
        return None
    return rank, world_size, local_rank


def srun_tasks_on_this_node() -> int | None:
    """How many of the step's tasks run on this node: SLURM_STEP_TASKS_PER_NODE ("4(x2),3", one entry per
    node, indexed by SLURM_NODEID), else SLURM_NTASKS_PER_NODE; None when neither says."""
    layout = os.environ.get("SLURM_STEP_TASKS_PER_NODE", "")
    if layout:
        counts: list[int] = []
        for entry in layout.split(","):
            count, _, repeat = entry.partition("(x")
            counts += [int(count)] * int(repeat.rstrip(")") or 1)
        node = int(os.environ.get("SLURM_NODEID", "0"))
        return counts[node] if node < len(counts) else None
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def adopt_srun_launch() -> None:
    """Under a multi-task srun without torchrun, export RANK / WORLD_SIZE / LOCAL_RANK (and
    LOCAL_WORLD_SIZE for the cpu budget) from SLURM's variables, so that the device index, the cpu
    budget and init_process_group's env:// rendezvous work as under torchrun. Runs before the device is
    resolved; a no-op otherwise (a single task is a plain single process)."""
    tasks = srun_tasks()
    if tasks is None:
        return
    rank, world_size, local_rank = tasks
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise UsageError(
            f"srun started {world_size} tasks but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            f"not set: export the first node's address and a free port before srun, e.g. {MASTER_EXAMPLE}"
        )
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    on_node = srun_tasks_on_this_node()
    if on_node and not _srun_bound_this_task():
        os.environ["LOCAL_WORLD_SIZE"] = str(on_node)


def _srun_bound_this_task() -> bool:
    """Whether srun already gave this task its own cores (--cpus-per-task with cpu binding): then the cpu
    budget must not split them again among the node's tasks, so LOCAL_WORLD_SIZE stays unset."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return False
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "1")
    return cores <= (int(per_task) if per_task.isdigit() else 1)


def refuse_torchrun(script: str) -> None:
    """validate.py and inference.py run in one process: under torchrun (or a multi-task srun) every rank
    would do the whole job and write the same results file, so a multi-process launch stops in one line
    instead."""
    if launched_by_torchrun():
        raise UsageError(
            f"{script} runs in one process, but torchrun started {os.environ['WORLD_SIZE']} (every one would "
            f"process every image and write the same results): run it without torchrun, with --device to pick "
            "the device"
        )
    tasks = srun_tasks()
    if tasks is not None:
        raise UsageError(
            f"{script} runs in one process, but srun started {tasks[1]} tasks (every one would process every "
            f"image and write the same results): run it as one task (srun --ntasks 1), with --device to pick "
            "the device"
        )


def init_distributed(
    device: torch.device, backend: str | None = None, timeout_seconds: float | None = None
) -> DistInfo:
    """Join the process group torchrun (or srun, see :func:`adopt_srun_launch`) describes (a no-op for a
    single process). ``timeout_seconds`` (``--dist-timeout``; None: torch's default) bounds its collectives
    and the device's own (:func:`set_device_collective_timeouts`), a few heartbeats longer
    (vtools/runtime/heartbeat.py) so that a rank that stopped is named before a collective gives up."""
    adopt_srun_launch()  # already done by setup_runtime, before the device was resolved; idempotent
    if not launched_by_torchrun():
        return DistInfo()
    if not dist.is_initialized():
        name = dist_backend(device, backend)
        kwargs: dict[str, Any] = {"device_id": device} if device.type != "cpu" and name != "gloo" else {}
        if timeout_seconds is not None:
            seconds = collective_timeout(timeout_seconds)
            set_device_collective_timeouts(device.type, seconds)
            kwargs["timeout"] = timedelta(seconds=seconds)
        if under_agent_store():  # torchrun's store outlives an attempt: a namespace of this attempt's own
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            store, _ = attempt_store(rank, world_size, kwargs.get("timeout", default_pg_timeout))
            kwargs.update(store=store, rank=rank, world_size=world_size)
        dist.init_process_group(backend=name, **kwargs)
    return DistInfo(dist.get_rank(), dist.get_world_size())


def check_collective_timeout(device: torch.device, dist_timeout: float) -> None:
    """--dist-timeout against the device's collective library: the timeout vtools exports for it (HCCL_EXEC_TIMEOUT,
    the option plus a few heartbeats) must be one the chip takes (an Atlas training chip: at most 17340 s;
    device_chips.py), said in one line now rather than by the library at the first collective. Nothing to
    check where the user set the variable (vtools leaves it) or the chip's range is not documented."""
    family = chip_family(device)
    unset = [name for name in kind_of(device.type).collective_timeout_env if name not in os.environ]
    if family is None or family.collective_timeout.value is None or not unset:
        return
    low, high = family.collective_timeout.value
    seconds = math.ceil(collective_timeout(dist_timeout))
    if low <= seconds <= high:
        return
    raise UsageError(
        f"--dist-timeout {dist_timeout:g}: {unset[0]} would be {seconds} s, and the {family.name} takes {low} to "
        f"{high} s ({family.collective_timeout.source}): give --dist-timeout {_longest_within(high):g} or less"
    )


def _longest_within(high: float) -> float:
    """The longest --dist-timeout (whole seconds) whose collective timeout is at most ``high``."""
    low, top = 0, int(high)
    while low < top:
        middle = (low + top + 1) // 2
        low, top = (middle, top) if math.ceil(collective_timeout(middle)) <= high else (low, middle - 1)
    return float(low)


def set_device_collective_timeouts(device_type: str, seconds: float) -> dict[str, str]:
    """Export the device's own collective timeout variables (its row's ``collective_timeout_env``, e.g.
    HCCL_EXEC_TIMEOUT) as whole ``seconds``, before its collective library reads them; a variable the user
    set is left as it is. Returns what was set."""
    chosen = {
        name: str(math.ceil(seconds)) for name in kind_of(device_type).collective_timeout_env if name not in os.environ
    }
    os.environ.update(chosen)
    return chosen


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks (identity without a process group)."""
    if _active():
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is set on any rank: one small all-reduce, so every rank gets the same answer."""
    if not _active():
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank (``[value]`` without a process group)."""
    if not _active():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of ``tensor`` (N x C, N may differ per rank) stacked in rank order, on every rank:
    two all-gathers on the device (the row counts, then the rows padded to the longest)."""
    if not _active():
        return tensor
    world = dist.get_world_size()
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = torch.cat(counts).tolist()  # one copy to the host for all ranks' counts
    padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:size] for piece, size in zip(pieces, sizes)])


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank, so that all ranks act on one decision."""
    if not _active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def computed_by_main(make: Callable[[], Any]) -> Any:
    """``make()`` run on rank 0 only and its result sent to every rank: work that every rank needs and
    one can do for all (listing a shared folder)."""
    if not _active():
        return make()
    return broadcast_from_main(make() if dist.get_rank() == 0 else None)


def barrier() -> None:
    """Wait for every rank (a no-op without a process group)."""
    if _active():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class ShardSampler(Sampler[int]):
    """Every sample exactly once across ranks: rank r takes indices r, r+W, r+2W, ...

    DistributedSampler pads the last shard with duplicates so that ranks stay
    in step; for evaluation that double-counts samples, so shards here may
    differ by one sample instead.
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)  # a range, not a list: no memory per sample

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
