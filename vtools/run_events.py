"""What a training run tells those who watch it: a log step's figures, how the run ended, and the run folder
a watcher may write into.

The training layer (vtools/train/) sends them and the trackers (vtools/observe/) read them: they live here,
below both, so that observing a run never imports the code that trains it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class LogPoint:
    """A log step's figures: the loss is the mean over the log window (one sync, which the log step makes
    anyway); ``step`` counts the epoch's steps done, from ``first_step`` where a resumed epoch began."""

    epoch: int
    step: int
    steps: int
    first_step: int
    num_updates: int
    loss: float
    lr: float
    images_per_second: float  # over the epoch so far (this process's part of it)
    data_wait: float  # the share of the epoch so far spent waiting for the next batch


@dataclass(frozen=True)
class RunEnd:
    """How the run ended, for the trackers' summaries."""

    status: str  # FINISHED, KILLED (a signal stopped it) or FAILED
    summary: dict[str, float | int | str]
    model_dir: Path | None = None  # the exported model folder, where the run finished
    report_dir: Path | None = None  # the best epoch's class report


class ClaimedFolder(Protocol):
    """The run folder as a watcher writes into it: the folder, and the call that enters a file or folder in
    its ledger before it is written, so that the run's clean-up and the output guard know it as the run's
    (vtools/train/run_lock.py's ``FolderClaim`` is the training run's)."""

    folder: Path

    def wrote(self, path: Path, created: bool) -> None: ...
