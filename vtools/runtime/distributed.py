"""torch.distributed set-up for torchrun, the same on every device type.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; the device layer picks the
device from LOCAL_RANK and the collective backend from the device type
(hccl on npu, nccl on cuda, gloo on cpu, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from vtools.errors import UsageError
from vtools.runtime.device import dist_backend


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
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def refuse_torchrun(script: str) -> None:
    """validate.py and inference.py run in one process: under torchrun every rank would do the whole job
    and write the same results file, so a multi-process launch stops in one line instead."""
    if launched_by_torchrun():
        raise UsageError(
            f"{script} runs in one process, but torchrun started {os.environ['WORLD_SIZE']} (every one would "
            f"process every image and write the same results): run it without torchrun, with --device to pick "
            "the device"
        )


def init_distributed(device: torch.device, backend: str | None = None) -> DistInfo:
    """Join the process group torchrun describes (a no-op for a single process)."""
    if not launched_by_torchrun():
        return DistInfo()
    if not dist.is_initialized():
        name = dist_backend(device, backend)
        kwargs = {"device_id": device} if device.type != "cpu" and name != "gloo" else {}
        dist.init_process_group(backend=name, **kwargs)
    return DistInfo(dist.get_rank(), dist.get_world_size())


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


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank, so that all ranks act on one decision."""
    if not _active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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
        self.indices = list(range(rank, length, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
