"""The trackers, as one registry, and which of them a command's options ask for.

Each tracker module, ``vtools/observe/<name>_tracker.py``, declares its ``ENTRY`` (vtools/observe/tracking.py
``TrackerEntry``: its name, its option fields, how train.py and validate.py build it); :data:`TRACKERS` is
every such entry, found by the modules' names, so a new tracker is its module and nothing else here.
train.py: the entries with a training tracker whose flag is given, on rank 0 (the other ranks send nothing).
validate.py: those with a validation tracker (MLflow: one run per model). The trackers' packages are imported
on their own threads (vtools/observe/tracking.py), so that asking for one never slows or stops the start.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from vtools import observe
from vtools.observe.tracking import START_SECONDS, TrackedRun, TrackerEntry, Trackers, ValidationRun, tracking_id
from vtools.options.shared import TrackingFlags
from vtools.options.train_job import TrainJob
from vtools.run_events import ClaimedFolder

TRACKER_MODULE = "_tracker"  # vtools/observe/<name>_tracker.py: a tracker's module, with its ENTRY


def tracker_entries() -> tuple[TrackerEntry, ...]:
    """The ``ENTRY`` of every tracker module of vtools/observe/, in the modules' name order."""
    names = sorted(module.name for module in pkgutil.iter_modules(observe.__path__))
    return tuple(
        importlib.import_module(f"{observe.__name__}.{name}").ENTRY for name in names if name.endswith(TRACKER_MODULE)
    )


TRACKERS: tuple[TrackerEntry, ...] = tracker_entries()
RUN_TAGS = ("model", "dataset", "device")


def training_trackers(
    job: TrainJob,
    options: dict[str, Any],
    claim: ClaimedFolder,
    resumed: bool,
    device: str,
    say: Callable[[str], None],
    is_main: bool,
    start_seconds: float = START_SECONDS,
) -> Trackers:
    """The run's trackers, started (none on ranks other than 0, or when no tracker is asked for). The
    folder's tracking id is read, or written, only where an asked-for tracker continues its run on --resume."""
    flags = job.tracking
    asked = [entry for entry in TRACKERS if entry.training and entry.wanted(flags)] if is_main else []
    if not asked:
        return Trackers([], say)
    folder = claim.folder
    keeps_id = any(entry.resumes for entry in asked)
    start_seconds = min(start_seconds, job.distributed.dist_timeout / 4)  # the other ranks wait for rank 0
    run = TrackedRun(
        name=folder.name,
        folder=folder,
        tracking_id=tracking_id(folder, claim.wrote) if keeps_id else "",
        resumed=resumed,
        options=options,
        tags=dict(zip(RUN_TAGS, (job.model.model, job.data.dataset or job.data.data_dir or "", device))),
        claim=claim,
        start_seconds=start_seconds,
    )
    return Trackers([entry.training(flags, run) for entry in asked if entry.training], say, start_seconds)


def validation_trackers(
    flags: TrackingFlags, options: dict[str, Any], tags: dict[str, str], say: Callable[[str], None]
) -> Trackers:
    """validate.py's trackers, from its tracking flags, with the command's options as their params."""
    run = ValidationRun(options, tags)
    asked = [entry.validation for entry in TRACKERS if entry.validation and entry.wanted(flags)]
    return Trackers([make(flags, run) for make in asked], say)
