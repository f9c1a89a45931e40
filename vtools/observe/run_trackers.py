"""Which trackers a command's options ask for, and what they are told about its run.

train.py: ``--log-wandb`` and ``--log-mlflow`` on rank 0 (the other ranks send nothing). validate.py:
``--log-mlflow``, one MLflow run per model. The trackers' packages are imported on their own threads
(vtools/observe/tracking.py), so that asking for one never slows or stops the command's start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vtools.observe.mlflow_tracker import MlflowTracker, MlflowValidation
from vtools.observe.tracking import START_SECONDS, TrackedRun, Tracker, Trackers, tracking_id
from vtools.observe.wandb_tracker import WANDB_FOLDER, WandbTracker, files_folder
from vtools.options.train_job import TrainJob
from vtools.train.run_lock import FolderClaim

RUN_TAGS = ("model", "dataset", "device")


def training_trackers(
    job: TrainJob,
    options: dict[str, Any],
    claim: FolderClaim,
    resumed: bool,
    device: str,
    say: Callable[[str], None],
    is_main: bool,
    start_seconds: float = START_SECONDS,
) -> Trackers:
    """The run's trackers, started (none on ranks other than 0, or when no tracker is asked for)."""
    logging = job.logging
    if not is_main or not (logging.log_wandb or logging.log_mlflow is not None):
        return Trackers([], say)
    folder = claim.folder
    run = TrackedRun(
        name=folder.name,
        folder=folder,
        tracking_id=tracking_id(folder, lambda path, created: claim.wrote(path, created)),
        resumed=resumed,
        options=options,
        tags=dict(zip(RUN_TAGS, (job.model.model, job.data.dataset or job.data.data_dir or "", device))),
    )
    start_seconds = min(start_seconds, job.distributed.dist_timeout / 4)  # the other ranks wait for rank 0
    trackers: list[Tracker] = []
    if logging.log_wandb:
        if files_folder(folder) == folder / WANDB_FOLDER:  # else WANDB_DIR's: not the run's to list or clean
            claim.wrote(folder / WANDB_FOLDER, created=not (folder / WANDB_FOLDER).exists())
        project, tags, resume_id = logging.wandb_project, logging.wandb_tags, logging.wandb_resume_id
        trackers.append(WandbTracker(run, project, tags, resume_id, start_seconds))
    if logging.log_mlflow is not None:
        trackers.append(MlflowTracker(run, logging.log_mlflow, logging.mlflow_experiment, logging.mlflow_artifacts))
    return Trackers(trackers, say, start_seconds)


def validation_trackers(
    uri: str | None, experiment: str | None, options: dict[str, Any], tags: dict[str, str], say: Callable[[str], None]
) -> Trackers:
    """validate.py's MLflow runs (one per model; ``uri`` None: none), with the command's options as params."""
    if uri is None:
        return Trackers([], say)
    return Trackers([MlflowValidation(uri, experiment, options, tags)], say)
