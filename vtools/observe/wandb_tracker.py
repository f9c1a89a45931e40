"""Weights & Biases, with timm's flags and timm's meaning, plus what timm does not log.

``--log-wandb`` logs what timm's train.py logs (one row per epoch: summary.csv's) and more: the resolved
options as the run's config, the run folder's name as the run's name, every log step's loss, lr, img/s
and data wait (x axis ``num_updates``), the best epoch's per-class table, and the run's end summary.
``--wandb-project``, ``--wandb-tags`` and ``--wandb-resume-id`` mean what they mean in timm (the last
resumes that W&B run, and fails the tracker, not the run, when W&B has no such run). Without it, the run
folder's tracking id is the W&B run id, so ``--resume`` continues the same W&B run.

W&B's run files go to ``<run>/wandb``, or to ``$WANDB_DIR/wandb`` where the user set ``WANDB_DIR`` (clusters
point it at scratch space); with ``WANDB_MODE=offline`` nothing leaves the machine, and ``wandb
sync <run>/wandb/offline-run-*`` uploads them later, from this machine: W&B keeps its logs and the staged
copy of the per-class table in its own user folders (``WANDB_DATA_DIR``, ``~/.cache/wandb``). The start is
bounded by W&B's own ``init_timeout``, and the tracker runs on its own thread (vtools/observe/tracking.py).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from vtools.evaluation.report_files import PER_CLASS
from vtools.observe.tracking import TrackedRun, TrackerEntry, epoch_metrics, step_metrics, tracker_package
from vtools.options.shared import TrackingFlags
from vtools.run_events import LogPoint, RunEnd

WANDB_FOLDER = "wandb"  # W&B makes it inside the folder it is given
RESOLVED_KEY = "run"  # the config's entry for the run's model, data and device as resolved (npu:0, the folder)


def files_folder(run_folder: Path) -> Path:
    """Where W&B writes this run's files: ``$WANDB_DIR/wandb`` when the user chose a place, else the run's."""
    chosen = os.environ.get("WANDB_DIR", "").strip()
    return (Path(chosen).expanduser() if chosen else run_folder) / WANDB_FOLDER


class WandbTracker:
    """One training run's W&B run (rank 0)."""

    name = "W&B"

    def __init__(self, run: TrackedRun, project: str | None, tags: list[str], resume_id: str, start_seconds: float):
        self.run_info, self.project, self.tags = run, project, list(tags)
        self.run_id = resume_id or run.tracking_id
        self.must_resume = bool(resume_id)  # timm: --wandb-resume-id resumes that run or fails
        self.start_seconds = start_seconds
        self.run: Any = None
        mode = os.environ.get("WANDB_MODE", "online")
        self.files = files_folder(run.folder)
        self.where = f"{mode}, project {project or 'uncategorized'}, run {self.run_id}, files in {self.files}"

    def start(self) -> None:
        wandb = tracker_package("wandb")
        settings = wandb.Settings(silent=True, console="off", init_timeout=self.start_seconds)
        self.run = wandb.init(
            project=self.project,
            name=self.run_info.name,
            id=self.run_id,
            resume="must" if self.must_resume else "allow",
            dir=str(self.files.parent),
            tags=self.tags or None,
            settings=settings,
        )
        # after the start, so that a resume with other values of the options a resume may change is taken;
        # the options as config.yaml holds them, and what the run resolved them to under "run"
        config = {**self.run_info.options, RESOLVED_KEY: self.run_info.tags}
        self.run.config.update(config, allow_val_change=True)
        self.run.define_metric("num_updates")
        self.run.define_metric("step/*", step_metric="num_updates")
        self.run.define_metric("epoch")

    def step(self, point: LogPoint) -> None:
        self.run.log({"num_updates": point.num_updates, "epoch_step": point.step, **step_metrics(point)})

    def epoch(self, row: dict[str, Any]) -> None:
        metrics = epoch_metrics(row)
        for key in metrics:
            self.run.define_metric(key, step_metric="epoch")
        self.run.log({"epoch": int(row["epoch"]), **metrics})

    def end(self, end: RunEnd) -> None:
        self.run.summary.update(end.summary)
        table = per_class_table(end)
        if table is not None:
            self.run.log({"eval/per_class": tracker_package("wandb").Table(columns=table[0], data=table[1])})
        self.run.finish(exit_code=0 if end.status == "FINISHED" else 1)


def per_class_table(end: RunEnd) -> tuple[list[str], list[list[Any]]] | None:
    """The best epoch's per-class report (<run>/eval/per_class.csv) as columns and rows, numbers as numbers."""
    path = end.report_dir / PER_CLASS if end.report_dir is not None else None
    if path is None or not path.is_file():
        return None
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        columns = next(reader, [])
        return columns, [[_number_or_text(cell) for cell in row] for row in reader]


def _number_or_text(cell: str) -> Any:
    try:
        return float(cell) if any(c in cell for c in ".eEn") else int(cell)
    except ValueError:
        return cell


def training_tracker(flags: TrackingFlags, run: TrackedRun) -> WandbTracker:
    """train.py's W&B run, from its flags; ``<run>/wandb`` is entered in the folder's ledger (a ``WANDB_DIR``
    elsewhere is not the run's to list or clean)."""
    if files_folder(run.folder) == run.folder / WANDB_FOLDER:
        run.writes(WANDB_FOLDER)
    return WandbTracker(run, flags.wandb_project, flags.wandb_tags, flags.wandb_resume_id, run.start_seconds)


ENTRY = TrackerEntry(
    "W&B", ("log_wandb", "wandb_project", "wandb_tags", "wandb_resume_id"), training=training_tracker, resumes=True
)
