"""When a training run takes its recovery checkpoints: every N updates, or every stretch of training time.

An epoch checkpoint protects a run from a polite stop (a signal lets it save first), not from a process
killed for memory, a node that reboots or a rank that a launcher restarts: those lose everything since the
last epoch, hours on ImageNet. A recovery checkpoint holds what a stop checkpoint holds, taken mid-epoch on
a schedule, so ``--resume auto`` (and a process that torchrun restarts with the same command line) loses at
most one interval.

Every rank must take a checkpoint at the same update (its random streams are gathered into it). A count of
updates agrees by construction; a time-form interval does not (each rank has its own clock), so the ranks
decide it together with one small all-reduce every ``check_every`` updates, the cadence at which they
already agree on a stop signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vtools.atomic import atomic_write_text
from vtools.derived_options import interval_seconds
from vtools.runtime.distributed import any_rank
from vtools.train.checkpoint import CheckpointManager
from vtools.train.loop import EpochResult, UpdatePoint
from vtools.train.resume import Position


@dataclass
class RecoverySchedule:
    """Whether the update just made is one to checkpoint after."""

    every_updates: int
    every_seconds: float | None
    check_every: int
    device: torch.device
    _since: float = field(default_factory=time.monotonic, repr=False)

    @classmethod
    def of(cls, interval: int | str, check_every: int, device: torch.device) -> RecoverySchedule | None:
        """The schedule --recovery-interval asks for (None when it is 0: off)."""
        seconds = interval_seconds(interval)
        if seconds is None and not interval:
            return None
        return cls(0 if seconds is not None else int(interval), seconds, max(1, check_every), device)

    def restart_clock(self) -> None:
        """Count the time form from now (training starts, or a checkpoint was just taken)."""
        self._since = time.monotonic()

    def due(self, num_updates: int) -> bool:
        """Whether to checkpoint after update ``num_updates``; the same answer on every rank."""
        if self.every_seconds is None:
            return num_updates % self.every_updates == 0
        if num_updates % self.check_every:
            return False
        return any_rank(time.monotonic() - self._since >= self.every_seconds, self.device)

    def describe(self) -> str:
        if self.every_seconds is None:
            return f"every {self.every_updates} updates"
        return f"every {self.every_seconds:g} s of training"


def recovery_saver(
    schedule: RecoverySchedule,
    record: Callable[[Position, EpochResult], dict[str, Any] | None],
    manager: CheckpointManager,
    is_main: bool,
) -> Callable[[UpdatePoint], None]:
    """``train_one_epoch``'s ``after_update``: a recovery checkpoint when ``schedule`` says one is due.
    Every rank records the state (``record``: its random streams are gathered into it); rank 0 (``is_main``)
    writes it in the background."""

    def save(point: UpdatePoint) -> None:
        if not schedule.due(point.num_updates):
            return
        state = record(Position(point.epoch, point.completed_steps, point.num_updates), point.so_far())
        if is_main:
            manager.save_recovery(state, point.epoch, point.completed_steps)
        schedule.restart_clock()

    return save


PROGRESS_NAME = ".vtools-progress"


@dataclass(frozen=True)
class ProgressMark:
    """How far the run got, as of its last log step: a tiny file rank 0 rewrites at each log step while
    recovery checkpoints are on, so that a process restarted after a kill can say how many updates it
    trains again (the interval's cost, made visible)."""

    folder: Path

    def write(self, epoch: int, step: int, num_updates: int) -> None:
        atomic_write_text(self.folder / PROGRESS_NAME, f"{epoch} {step} {num_updates}\n", durable=False)

    def updates_reached(self) -> int | None:
        """The update count of the last log step written, or None (no mark, or not one this writes)."""
        try:
            fields = (self.folder / PROGRESS_NAME).read_text(encoding="utf-8").split()
        except OSError:
            return None
        return int(fields[2]) if len(fields) == 3 and all(field.isdigit() for field in fields) else None

    def redone_note(self, num_updates: int) -> str:
        """What a resume from update ``num_updates`` trains again, when the run had got further."""
        reached = self.updates_reached()
        if reached is None or reached <= num_updates:
            return ""
        return (
            f"; the process before had reached update {reached} at its last log step: {reached - num_updates} "
            "update(s) are trained again"
        )
