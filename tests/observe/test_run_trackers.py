"""Which trackers a run's options start, what they are told, and what the run folder records."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import typing
from pathlib import Path

import pytest

from tests.conftest import REPO, summary, train_args
from tests.observe import jsonl_tracker
from vtools import observe
from vtools.cli import train_flags
from vtools.cli.typed import typed_options
from vtools.observe import run_trackers
from vtools.observe.mlflow_tracker import RUN_ID_TAG, MlflowTracker, MlflowValidation
from vtools.observe.run_trackers import TRACKERS, training_trackers, validation_trackers
from vtools.observe.tensorboard_tracker import TensorBoardTracker
from vtools.observe.tracking import TRACKING_FILE
from vtools.observe.wandb_tracker import WANDB_FOLDER, WandbTracker
from vtools.options.shared import TrackingFlags
from vtools.options.train_job import TrainJob
from vtools.run_events import RunEnd
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
        mlflow, wandb = (feed.tracker for feed in trackers.feeds)  # the registry's order: module names
        assert isinstance(wandb, WandbTracker) and isinstance(mlflow, MlflowTracker)
        trackers.begin()
        run_id = json.loads((claim.folder / TRACKING_FILE).read_text())["id"]
        assert wandb.run_id == run_id and wandb.run_info.name == "run-a"
        assert {TRACKING_FILE, WANDB_FOLDER} <= claim.ledger
        assert trackers.close(RunEnd("FINISHED", {"best_top1": 50.0, "best_epoch": 0})) == []
    assert said == [f"tracking: MLflow ({uri})", f"tracking: {wandb.name} ({wandb.where})"]
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
    assert validation_trackers(TrackingFlags(), {}, {}, print).feeds == []
    flags = TrackingFlags(log_mlflow="sqlite:///:memory:", mlflow_experiment="e", log_wandb=True)
    trackers = validation_trackers(flags, {"model": "m"}, {"device": "cpu"}, print)
    (feed,) = trackers.feeds
    assert isinstance(feed.tracker, MlflowValidation) and feed.tracker.options == {"model": "m"}
    assert feed.tracker.uri == "sqlite:///:memory:" and feed.tracker.experiment == "e"
    trackers.close(RunEnd("FINISHED", {}))


def test_tensorboard_is_a_tracker_that_enters_its_folder_and_keeps_no_tracking_id(tmp_path: Path) -> None:
    """--log-tensorboard alone: one tracker writing <run>/tensorboard, entered in the folder's ledger; no
    tracker of it continues a run on --resume, so no tracking.json is written."""
    said: list[str] = []
    with owned_folder(tmp_path / "run") as claim:
        trackers = training_trackers(job("--log-tensorboard"), {}, claim, False, "cpu", said.append, True)
        (feed,) = trackers.feeds
        assert isinstance(feed.tracker, TensorBoardTracker) and feed.tracker.folder == claim.folder / "tensorboard"
        assert claim.ledger == {"tensorboard"} and not (claim.folder / TRACKING_FILE).exists()
        trackers.begin()
        assert trackers.close(RunEnd("FINISHED", {})) == []
    assert said == [f"tracking: TensorBoard ({tmp_path / 'run' / 'tensorboard'})"]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def test_every_tracker_is_asked_for_by_declared_option_fields() -> None:
    """An entry's flags are fields of the one tracking concern both commands hold (train.py's job.tracking,
    validate.py's TrackingFlags); the first of them, given, asks for it."""
    fields = {field.name for field in dataclasses.fields(TrackingFlags)}
    assert typing.get_type_hints(TrainJob)["tracking"] is TrackingFlags
    assert [entry.name for entry in TRACKERS] == ["MLflow", "TensorBoard", "W&B"]  # every *_tracker.py's
    for entry in TRACKERS:
        assert entry.flags and entry.asked is None, entry.name
        assert set(entry.flags) <= fields, entry.name
    asked = job("--log-tensorboard", "--log-mlflow").tracking
    assert [entry.name for entry in TRACKERS if entry.wanted(asked)] == ["MLflow", "TensorBoard"]
    assert not any(entry.wanted(job().tracking) for entry in TRACKERS)


# ---------------------------------------------------------------- docs/development.md's tracker


def test_the_development_guide_shows_the_registry_and_a_real_tracker() -> None:
    """ "Adding a tracker" quotes the registry's naming rule as run_trackers.py has it and the whole of the
    suite's JSON-lines tracker, the module the next test runs in train.py and validate.py."""
    guide = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    registry, module = re.findall(r"```python\n(.*?)```", guide[guide.index("## Adding a tracker") :], re.S)
    assert registry in (REPO / "vtools" / "observe" / "run_trackers.py").read_text(encoding="utf-8")
    assert module == Path(jsonl_tracker.__file__).read_text(encoding="utf-8")


def test_a_tracker_written_as_the_guide_says_runs_in_train_and_validate(
    fashion4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The guide's tracker, its entry added to the registry and switched on as it says, is sent train.py's
    log steps, its summary.csv rows and its end, then validate.py's results row: both commands, in process."""
    from vtools.cli.runner import command_main

    events = tmp_path / "events.jsonl"
    beside = tmp_path / "beside"  # the module as the guide says to save it, and no other edit
    beside.mkdir()
    shutil.copy(jsonl_tracker.__file__, beside / "jsonl_tracker.py")
    monkeypatch.setattr(observe, "__path__", [*observe.__path__, str(beside)])
    found = run_trackers.tracker_entries()
    assert [entry.name for entry in found] == ["JSON lines", "MLflow", "TensorBoard", "W&B"]
    monkeypatch.setattr(run_trackers, "TRACKERS", found)
    monkeypatch.setenv(jsonl_tracker.VARIABLE, str(events))
    argv = train_args(fashion4, tmp_path, "run", "--device", "cpu", "--epochs", "1", "--log-interval", "4")
    assert command_main("train")(argv[1:]) == 0
    said = capsys.readouterr().out
    assert f"tracking: JSON lines ({events})" in said and said.count("JSON lines") == 1  # no warning, none lost
    sent = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines()]
    assert [line["kind"] for line in sent] == ["step", "step", "epoch", "end"]
    assert [line["num_updates"] for line in sent[:2]] == [4, 7]  # 240 images / 32: 7 updates, logged at 4 and the last
    (row,) = summary(tmp_path / "run")
    assert {key: str(value) for key, value in sent[2].items() if key != "kind"} == row
    assert sent[3]["status"] == "FINISHED" and sent[3]["epochs"] == 1
    validate = [str(fashion4 / "val"), "--model", str(tmp_path / "run" / "model"), "--device", "cpu"]
    assert command_main("validate")([*validate, "--batch-size", "32", "--workers", "1"]) == 0
    said = capsys.readouterr().out
    assert f"tracking: JSON lines ({events})" in said and said.count("JSON lines") == 1
    result, end = (json.loads(line) for line in events.read_text(encoding="utf-8").splitlines()[4:])
    assert result["kind"] == "result" and result["samples"] == 60 and end == {"kind": "end", "status": "FINISHED"}
