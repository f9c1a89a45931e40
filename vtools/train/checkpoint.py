"""Resumable training checkpoints: written atomically, read with ``weights_only=True``.

A checkpoint holds everything needed to continue a run exactly: model,
optimizer, scheduler, GradScaler, EMA, epoch, position within the epoch,
best metric and every RNG state. Its keys follow timm's (``state_dict``,
``state_dict_ema``, ``epoch``, ``arch``), so validate.py and timm's own
scripts read it with ``--checkpoint``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vtools.atomic import atomic_copy, atomic_link, atomic_write
from vtools.errors import UsageError
from vtools.evaluation.best_epoch import improves
from vtools.models.weights import UnreadableCheckpoint, safe_load

LAST = "last.pth.tar"
BEST = "model_best.pth.tar"
NUMBERED = re.compile(r"^checkpoint-(\d+)\.pth\.tar$")
RECOVERY = re.compile(r"^recovery-(\d+)-(\d+)\.pth\.tar$")  # recovery-<epoch>-<step>, as timm names them


def recovery_name(epoch: int, step: int) -> str:
    return f"recovery-{epoch}-{step}.pth.tar"


def recovery_files(folder: Path) -> list[Path]:
    """The recovery checkpoints in ``folder``, oldest position first."""
    found = [
        ((int(m.group(1)), int(m.group(2))), p)
        for p in folder.glob("recovery-*.pth.tar")
        if (m := RECOVERY.match(p.name))
    ]
    return [path for _, path in sorted(found)]


def portable_rng(state: dict[str, Any]) -> dict[str, Any]:
    """RNG states in types that ``weights_only`` loading accepts (no numpy arrays)."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached]}


def native_rng(state: dict[str, Any]) -> dict[str, Any]:
    """Undo :func:`portable_rng`."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    python_version, python_state, gauss = state["python"]
    return {
        **state,
        "numpy": (name, keys.numpy().astype(np.uint32), pos, has_gauss, cached),
        "python": (python_version, tuple(python_state), gauss),
    }


def load_training_state(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :class:`CheckpointManager` (safe loading only)."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--resume {path}: no such checkpoint")
    try:
        state = safe_load(file)
    except UnreadableCheckpoint as err:
        raise UsageError(f"--resume {path}: not a readable training checkpoint ({err.detail})") from err
    except UsageError as err:  # refused: loading it would run code
        raise UsageError(f"--resume {err}") from err
    missing = [key for key in ("state_dict", "optimizer", "epoch", "rng") if key not in state]
    if not isinstance(state, dict) or missing:
        raise UsageError(f"--resume {path}: not a vtools training checkpoint (missing {', '.join(missing)})")
    return state


@dataclass
class RecoveryStats:
    """What the recovery checkpoints cost the training steps in this process: how many were taken, the
    seconds spent copying the state to host memory, and the seconds spent waiting for the previous
    write to reach the disk."""

    count: int = 0
    copy_seconds: float = 0.0
    wait_seconds: float = 0.0

    def add(self, waited: float, copied: float) -> None:
        self.count += 1
        self.wait_seconds += waited
        self.copy_seconds += copied


@dataclass
class CheckpointManager:
    """Keeps last, best and the newest ``keep`` numbered checkpoints in ``folder``.

    An epoch's checkpoint is written in a background thread from a host copy of
    the state, so the next epoch trains while it goes to disk (and is fsynced);
    the numbered one is a copy of that file, never a hard link: ``last`` is
    replaced every epoch and is the file people copy things onto, and a damaged
    ``last`` must leave the numbered ones intact for ``--resume auto`` to fall
    back on. Best is a second name of the epoch's numbered file, as timm's
    CheckpointSaver links it: vtools never writes either again, so sharing their
    data saves a write per improvement; a file copied onto one of them in place
    changes both.
    :meth:`wait` blocks until the last one is whole and raises its failure; the
    next save, an interrupted save and the end of a run call it.
    """

    folder: Path
    keep: int = 10
    higher_is_better: bool = True
    best_metric: float | None = None
    best_epoch: int | None = None
    on_write: Callable[[Path], None] = field(default=lambda path: None, repr=False)  # told before each write
    keep_recovery: int = 2
    wrote_here: Callable[[str], bool] = field(default=lambda name: True, repr=False)  # a vtools run wrote it
    recovery: RecoveryStats = field(default_factory=lambda: RecoveryStats())
    _writer: threading.Thread | None = field(default=None, repr=False)
    _failure: BaseException | None = field(default=None, repr=False)

    def is_better(self, metric: float) -> bool:
        return improves(metric, self.best_metric, self.higher_is_better)

    def save(self, state: dict[str, Any], epoch: int, metric: float | None) -> bool:
        """Start writing last, and for a validated epoch (``metric`` given) a numbered one and best when
        improved; returns whether this is the new best."""
        self.wait()
        improved = metric is not None and self.is_better(metric)
        if improved:
            self.best_metric, self.best_epoch = metric, epoch
        # "metric": the epoch's own, as timm's CheckpointSaver records it (its avg_checkpoints.py ranks by it)
        scores = {"best_metric": self.best_metric, "best_epoch": self.best_epoch}
        snapshot = host_copy({**state, **scores, **({"metric": metric} if metric is not None else {})})
        self._writer = threading.Thread(
            target=self._write_in_background,
            name="checkpoint-writer",
            args=(snapshot, epoch, metric is not None, improved),
        )
        self._writer.start()
        return improved

    def save_recovery(self, state: dict[str, Any], epoch: int, step: int) -> None:
        """Start writing a recovery checkpoint (mid-epoch, at ``step``) and keep the newest
        ``keep_recovery``. The training step pays for the copy to host memory, and waits for the disk
        only while the previous checkpoint is still being written (at most one is in flight); both
        times are counted in :attr:`recovery`."""
        started = time.perf_counter()
        self.wait()
        copying = time.perf_counter()
        snapshot = host_copy({**state, "best_metric": self.best_metric, "best_epoch": self.best_epoch})
        done = time.perf_counter()
        self.recovery.add(waited=copying - started, copied=done - copying)
        self._writer = threading.Thread(
            target=self._write_recovery, name="recovery-writer", args=(snapshot, recovery_name(epoch, step))
        )
        self._writer.start()

    def _write_recovery(self, state: dict[str, Any], name: str) -> None:
        try:
            atomic_write(self._claim(name), lambda stream: torch.save(state, stream))
            ours = [path for path in recovery_files(self.folder) if self.wrote_here(path.name)]
            for stale in ours[: -max(1, self.keep_recovery)]:
                stale.unlink(missing_ok=True)
        except BaseException as err:  # handed to the main thread by wait()
            self._failure = err

    def wait(self) -> None:
        """Return once the checkpoint being written is on disk; raise what made its write fail."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _write_in_background(self, state: dict[str, Any], epoch: int, validated: bool, improved: bool) -> None:
        try:
            last = atomic_write(self._claim(LAST), lambda stream: torch.save(state, stream))
            numbered = None
            if self.keep > 0 and validated:  # a copy of the file, not a second serialization
                numbered = atomic_copy(last, self._claim(f"checkpoint-{epoch}.pth.tar"))
                self._prune()
            if improved and numbered is not None:  # the epoch's numbered file under a second name
                atomic_link(numbered, self._claim(BEST))
            elif improved:
                atomic_copy(last, self._claim(BEST))
        except BaseException as err:  # handed to the main thread by wait()
            self._failure = err

    def save_interrupted(self, state: dict[str, Any]) -> Path:
        """A mid-epoch checkpoint (on SIGINT/SIGTERM) that --resume continues from, written now."""
        self.wait()
        state = {**state, "best_metric": self.best_metric, "best_epoch": self.best_epoch}
        return atomic_write(self._claim(LAST), lambda stream: torch.save(state, stream))

    def _claim(self, name: str) -> Path:
        path = self.folder / name
        self.on_write(path)
        return path

    def _prune(self) -> None:
        numbered = sorted((int(m.group(1)), p) for p in self.folder.iterdir() if (m := NUMBERED.match(p.name)))
        for _, path in numbered[: -self.keep]:
            path.unlink(missing_ok=True)


def host_copy(value: Any) -> Any:
    """``value`` with every tensor copied to host memory: what the background writer saves while
    training goes on changing the live weights and optimizer state."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        copied = type(value)((key, host_copy(item)) for key, item in value.items())
        if hasattr(value, "_metadata"):  # a module state_dict's version record: loading reads it
            copied._metadata = value._metadata
        return copied
    if isinstance(value, list):
        return [host_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(host_copy(item) for item in value)
    return value
