"""MLflow: a training run's options, metric histories and artifacts; a validation run's results row.

``--log-mlflow [URI]`` logs to the tracking server or store at URI (default: ``MLFLOW_TRACKING_URI``,
else MLflow's own local default: ``mlflow.db`` with artifacts in ``./mlruns``) into ``--mlflow-experiment``
(default: ``MLFLOW_EXPERIMENT_NAME``, else MLflow's Default experiment).

A training run logs the resolved options as params, every log step's ``step/*`` figures at step
``num_updates``, every summary.csv column at step ``epoch`` (so a metric's history is summary.csv's
column), tags for model, dataset and device, and at the end the summary as metrics and, with
``--mlflow-artifacts``, the model folder and the class report as artifacts. The MLflow run carries the
run folder's tracking id as the tag ``vtools.run_id``, by which ``--resume`` finds and continues it.
validate.py logs one MLflow run per model with its results row.

MLflow's HTTP client retries for minutes by default: its retries and timeout are shortened here, and its
"View run" lines kept out of the command's output (where the environment does not set either); its calls
run on the tracker's own thread (vtools/observe/tracking.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from vtools.observe.tracking import TrackedRun, TrackerEntry, epoch_metrics, step_metrics, tracker_package
from vtools.run_events import LogPoint, RunEnd

RUN_ID_TAG = "vtools.run_id"
ENV_DEFAULTS = {  # where the environment does not say otherwise
    # a dead server fails a call in seconds, not after minutes of retries
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    # no "View run" lines from the tracker's thread in the command's output (their emoji also fail a
    # stdout that cannot encode them, which would lose the run's end); the start line says where it goes
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def tracking_place(uri: str) -> str:
    """Where the runs go, in words, without asking MLflow (known before the tracker starts)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    return uri or "MLflow's local default: mlflow.db and ./mlruns"


class MlflowRuns:
    """A connection to one MLflow experiment (made on the tracker's thread)."""

    def __init__(self, uri: str, experiment: str | None) -> None:
        for name, value in ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        tracker_package("mlflow")
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO lines about database tables
        from mlflow import MlflowClient

        self.client = MlflowClient(uri or None)
        name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "") or "Default"
        found = self.client.get_experiment_by_name(name)
        self.experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)

    def find(self, tracking_id: str) -> Any:
        """The run tagged with this tracking id, or None."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{tracking_id}'", max_results=1
        )
        return runs[0] if runs else None

    def create(self, name: str, tags: dict[str, str]) -> str:
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def log(self, run_id: str, metrics: dict[str, float], step: int = 0, params: dict[str, Any] | None = None) -> None:
        """Metrics at ``step`` and params, in as many calls as MLflow's batch limits need."""
        from mlflow.entities import Metric, Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        stamp = int(time.time() * 1000)
        rows = [Metric(key, value, stamp, step) for key, value in metrics.items()]
        texts = [Param(key, param_text(value, MAX_PARAM_VAL_LENGTH)) for key, value in (params or {}).items()]
        for chunk in chunks(texts, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=chunk)
        if rows:
            self.client.log_batch(run_id, metrics=rows)


def param_text(value: Any, limit: int) -> str:
    """A param's value as MLflow stores it: text, cut to MLflow's own length limit."""
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowTracker:
    """One training run's MLflow run (rank 0)."""

    name = "MLflow"

    def __init__(self, run: TrackedRun, uri: str, experiment: str | None, artifacts: bool) -> None:
        self.run_info, self.uri, self.experiment, self.artifacts = run, uri, experiment, artifacts
        self.where = tracking_place(uri)
        self.runs: MlflowRuns | None = None
        self.run_id = ""

    def start(self) -> None:
        self.runs = runs = MlflowRuns(self.uri, self.experiment)
        info = self.run_info
        found = runs.find(info.tracking_id) if info.resumed else None
        if found is not None:  # a resume: the same run, going again; the params it has keep their values
            self.run_id = found.info.run_id
            runs.client.update_run(self.run_id, status="RUNNING")
            known = set(found.data.params)
        else:
            self.run_id = runs.create(info.name, {**info.tags, RUN_ID_TAG: info.tracking_id})
            known = set()
        runs.log(self.run_id, {}, params={k: v for k, v in info.options.items() if k not in known})

    def step(self, point: LogPoint) -> None:
        assert self.runs is not None
        self.runs.log(self.run_id, step_metrics(point), step=point.num_updates)

    def epoch(self, row: dict[str, Any]) -> None:
        assert self.runs is not None
        self.runs.log(self.run_id, epoch_metrics(row), step=int(row["epoch"]))

    def end(self, end: RunEnd) -> None:
        assert self.runs is not None
        numbers = {k: float(v) for k, v in end.summary.items() if isinstance(v, (int, float))}
        self.runs.log(self.run_id, numbers)
        for key, value in end.summary.items():
            if not isinstance(value, (int, float)):
                self.runs.client.set_tag(self.run_id, key, str(value))
        if self.artifacts:
            for folder, name in ((end.model_dir, "model"), (end.report_dir, "eval")):
                if folder is not None and folder.is_dir():
                    self.runs.client.log_artifacts(self.run_id, str(folder), name)
        self.runs.client.set_terminated(self.run_id, end.status)


class MlflowValidation:
    """validate.py's MLflow runs: one per model, with the results row as metrics (its numbers) and tags."""

    name = "MLflow"

    def __init__(self, uri: str, experiment: str | None, options: dict[str, Any], tags: dict[str, str]) -> None:
        self.uri, self.experiment, self.options, self.tags = uri, experiment, options, tags
        self.where = tracking_place(uri)
        self.runs: MlflowRuns | None = None
        self.run_ids: list[str] = []

    def start(self) -> None:
        self.runs = MlflowRuns(self.uri, self.experiment)

    def result(self, row: dict[str, Any]) -> None:
        assert self.runs is not None
        words = {k: str(v) for k, v in row.items() if isinstance(v, str) and v}
        run_id = self.runs.create(f"validate {row['model']}", {**self.tags, **words, "vtools.command": "validate"})
        numbers = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.runs.log(run_id, numbers, params=self.options)
        self.runs.client.set_terminated(run_id, "FINISHED")
        self.run_ids.append(run_id)

    def end(self, end: RunEnd) -> None:
        """Nothing to close: each model's run ended with its row."""


ENTRY = TrackerEntry(
    "MLflow",
    ("log_mlflow", "mlflow_experiment", "mlflow_artifacts"),
    training=lambda flags, run: MlflowTracker(run, flags.log_mlflow, flags.mlflow_experiment, flags.mlflow_artifacts),
    validation=lambda flags, run: MlflowValidation(flags.log_mlflow, flags.mlflow_experiment, run.options, run.tags),
    resumes=True,
)
