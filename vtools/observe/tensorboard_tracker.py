"""TensorBoard: ``--log-tensorboard`` writes the run's scalars into ``<run>/tensorboard``.

One point per epoch with the values of that epoch's ``summary.csv`` row (train/eval loss, top-1, top-5,
lr, img/s, data wait) and one per log step (loss over the log window, lr, img/s, data wait), named as
W&B and MLflow name them. A tracker like theirs (vtools/observe/tracking.py): it writes on its own thread
and a failed write never fails the run. Its package is imported on the command's thread when the tracker
is made, before the run starts, so that a missing one stops the command in one line naming the install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vtools.observe.tracking import TrackedRun, TrackerEntry, step_metrics
from vtools.optional import TRACK, optional_module
from vtools.options.shared import TrackingFlags
from vtools.run_events import LogPoint, RunEnd

TENSORBOARD_FOLDER = "tensorboard"
EPOCH_SCALARS = {  # summary.csv's columns and their TensorBoard tags
    "train_loss": "train/loss",
    "eval_loss": "eval/loss",
    "eval_top1": "eval/top1",
    "eval_top5": "eval/top5",
    "eval_map": "eval/map",
    "eval_map_micro": "eval/map_micro",
    "eval_f1": "eval/f1",
    "lr": "lr",
    "img_per_sec": "train/img_per_sec",
    "data_wait": "train/data_wait",
}


class TensorBoardTracker:
    """A training run's TensorBoard event files (rank 0)."""

    name = "TensorBoard"

    def __init__(self, folder: Path) -> None:
        optional_module("tensorboard", "--log-tensorboard", TRACK)
        from torch.utils.tensorboard import SummaryWriter

        self.make_writer = SummaryWriter
        self.folder = folder
        self.where = str(folder)
        self.writer: Any = None

    def start(self) -> None:
        self.writer = self.make_writer(str(self.folder))

    def step(self, point: LogPoint) -> None:
        """A log step's figures at its update count, named as W&B and MLflow name them."""
        for tag, value in step_metrics(point).items():
            self.writer.add_scalar(tag, value, point.num_updates)

    def epoch(self, row: dict[str, Any]) -> None:
        """The epoch's summary.csv row (eval values are empty in epochs without validation)."""
        for key, tag in EPOCH_SCALARS.items():
            if row.get(key, "") != "":
                self.writer.add_scalar(tag, float(row[key]), int(row["epoch"]))
        self.writer.flush()

    def end(self, end: RunEnd) -> None:
        self.writer.close()


def training_tracker(flags: TrackingFlags, run: TrackedRun) -> TensorBoardTracker:
    """train.py's event files, in ``<run>/tensorboard``: entered in the folder's ledger once the package is found."""
    tracker = TensorBoardTracker(run.folder / TENSORBOARD_FOLDER)
    run.writes(TENSORBOARD_FOLDER)
    return tracker


ENTRY = TrackerEntry("TensorBoard", ("log_tensorboard",), training=training_tracker)
