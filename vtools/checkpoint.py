"""Resumable training checkpoints: written atomically, read with ``weights_only=True``.

A checkpoint holds everything needed to continue a run exactly: model,
optimizer, scheduler, GradScaler, EMA, epoch, position within the epoch,
best metric and every RNG state. Its keys follow timm's (``state_dict``,
``state_dict_ema``, ``epoch``, ``arch``), so validate.py and timm's own
scripts read it with ``--checkpoint``.
"""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vtools.errors import UsageError
from vtools.files import atomic_write
from vtools.models import unpickling_message

LAST = "last.pth.tar"
BEST = "model_best.pth.tar"
NUMBERED = re.compile(r"^checkpoint-(\d+)\.pth\.tar$")


def portable_rng(state: dict[str, Any]) -> dict[str, Any]:
    """RNG states in types that ``weights_only`` loading accepts (no numpy arrays)."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached]}


def native_rng(state: dict[str, Any]) -> dict[str, Any]:
    """Undo :func:`portable_rng`."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    python_version, python_state, gauss = state["python"]
    return {**state, "numpy": (name, keys.numpy().astype(np.uint32), pos, has_gauss, cached),
            "python": (python_version, tuple(python_state), gauss)}


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def load_training_state(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :class:`CheckpointManager` (safe loading only)."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--resume {path}: no such checkpoint")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # refused: it would run code, or not a checkpoint at all
        message = unpickling_message(file, err)
        if "refused" in message:
            raise UsageError(f"--resume {message}") from err
        raise UsageError(f"--resume {path}: not a readable training checkpoint ({message})") from err
    except Exception as err:  # truncation, not a zip: all mean "not a checkpoint of ours"
        reason = str(err).strip().splitlines()[-1][:160] if str(err).strip() else type(err).__name__
        raise UsageError(f"--resume {path}: not a readable training checkpoint ({reason})") from err
    missing = [key for key in ("state_dict", "optimizer", "epoch", "rng") if key not in state]
    if not isinstance(state, dict) or missing:
        raise UsageError(f"--resume {path}: not a vtools training checkpoint (missing {', '.join(missing)})")
    return state


@dataclass
class CheckpointManager:
    """Keeps last, best and the newest ``keep`` numbered checkpoints in ``folder``."""

    folder: Path
    keep: int = 10
    higher_is_better: bool = True
    best_metric: float | None = None
    best_epoch: int | None = None
    saved: list[Path] = field(default_factory=list)

    def is_better(self, metric: float) -> bool:
        if self.best_metric is None:
            return True
        return metric > self.best_metric if self.higher_is_better else metric < self.best_metric

    def save(self, state: dict[str, Any], epoch: int, metric: float | None) -> bool:
        """Write last, and for a validated epoch (``metric`` given) a numbered one and best when improved;
        returns whether this is the new best."""
        improved = metric is not None and self.is_better(metric)
        if improved:
            self.best_metric, self.best_epoch = metric, epoch
        state = {**state, "best_metric": self.best_metric, "best_epoch": self.best_epoch}
        payload = serialize(state)
        atomic_write(self.folder / LAST, lambda stream: stream.write(payload))
        if self.keep > 0 and metric is not None:
            atomic_write(self.folder / f"checkpoint-{epoch}.pth.tar", lambda stream: stream.write(payload))
            self._prune()
        if improved:
            atomic_write(self.folder / BEST, lambda stream: stream.write(payload))
        return improved

    def save_interrupted(self, state: dict[str, Any]) -> Path:
        """A mid-epoch checkpoint (on SIGINT/SIGTERM) that --resume continues from."""
        payload = serialize({**state, "best_metric": self.best_metric, "best_epoch": self.best_epoch})
        return atomic_write(self.folder / LAST, lambda stream: stream.write(payload))

    def _prune(self) -> None:
        numbered = sorted((int(m.group(1)), p) for p in self.folder.iterdir() if (m := NUMBERED.match(p.name)))
        for _, path in numbered[:-self.keep]:
            path.unlink(missing_ok=True)
