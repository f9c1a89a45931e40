"""Which trackers a run's options start, what they are told, and what the run folder records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vtools.cli import train_flags
from vtools.cli.typed import typed_options
from vtools.observe.mlflow_tracker import RUN_ID_TAG, MlflowTracker, MlflowValidation
from vtools.observe.run_trackers import training_trackers, validation_trackers
from vtools.observe.tracking import TRACKING_FILE, RunEnd
from vtools.observe.wandb_tracker import WANDB_FOLDER, WandbTracker
from vtools.options.train_job import TrainJob
from vtools.train.run_lock import owned_folder

pytestmark = pytest.mark.cpu_only(reason="the trackers run on the host whatever the device")


def job(*flags: str) -> TrainJob:
    return typed_options(TrainJob, train_flags.parse(["/data/set", "--model", "test_resnet", *flags]))


def test_no_tracker_asked_for_or_another_rank_starts_none_and_writes_nothing(tmp_path: Path) -> None:
    with owned_folder(tmp_path / "run") as claim:
        for options, is_main in ((job(), True), (job("--log-wandb", "--log-mlflow"), False)):
            trackers = training_trackers(options, {}, claim, False, "cpu", print, is_main)
            assert trackers.feeds == []
            assert trackers.close(RunEnd("FINISHED", {})) == []
        assert not (claim.folder / TRACKING_FILE).exists() and claim.ledger == set()


@pytest.mark.slow
def test_both_trackers_start_with_the_folder_id_name_and_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline and MLflow on a SQLite store in the test's folder: both real, both told the same run."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    options = job("--log-wandb", "--wandb-project", "p", "--log-mlflow", uri, "--mlflow-experiment", "e")
    said: list[str] = []
    with owned_folder(tmp_path / "run-a") as claim:
        trackers = training_trackers(
            options, {"model": "test_resnet", "lr": 0.1}, claim, False, "cpu", said.append, True
        )
        wandb, mlflow = (feed.tracker for feed in trackers.feeds)
        assert isinstance(wandb, WandbTracker) and isinstance(mlflow, MlflowTracker)
        trackers.begin()
        run_id = json.loads((claim.folder / TRACKING_FILE).read_text())["id"]
        assert wandb.run_id == run_id and wandb.run_info.name == "run-a"
        assert {TRACKING_FILE, WANDB_FOLDER} <= claim.ledger
        assert trackers.close(RunEnd("FINISHED", {"best_top1": 50.0, "best_epoch": 0})) == []
    assert said == [f"tracking: {wandb.name} ({wandb.where})", f"tracking: MLflow ({uri})"]
    assert list((tmp_path / "run-a" / WANDB_FOLDER).glob(f"offline-run-*-{run_id}"))
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    assert run.data.tags[RUN_ID_TAG] == run_id
    assert {k: run.data.tags[k] for k in ("model", "dataset", "device")} == {
        "model": "test_resnet",
        "dataset": "/data/set",
        "device": "cpu",
    }
    assert run.data.params == {"model": "test_resnet", "lr": "0.1"}
    assert run.data.metrics == {"best_top1": 50.0, "best_epoch": 0.0}


def test_validation_trackers_are_mlflow_only_and_only_when_asked() -> None:
    assert validation_trackers(None, None, {}, {}, print).feeds == []
    trackers = validation_trackers("sqlite:///:memory:", "e", {"model": "m"}, {"device": "cpu"}, print)
    (feed,) = trackers.feeds
    assert isinstance(feed.tracker, MlflowValidation) and feed.tracker.options == {"model": "m"}
    trackers.close(RunEnd("FINISHED", {}))
