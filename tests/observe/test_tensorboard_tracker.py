"""TensorBoard as a tracker: the scalars it is sent, read back with tensorboard's own reader; a missing package
stops the command before the run. (A whole run's event files against its summary.csv: test_curves.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vtools.errors import UsageError
from vtools.observe.tensorboard_tracker import TensorBoardTracker
from vtools.observe.tracking import Trackers
from vtools.run_events import LogPoint, RunEnd

pytestmark = pytest.mark.cpu_only(reason="event files are written on the host whatever the device")


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_log_steps_at_their_update_and_epoch_rows_at_their_epoch(tmp_path: Path) -> None:
    said: list[str] = []
    trackers = Trackers([TensorBoardTracker(tmp_path / "tensorboard")], said.append)
    trackers.begin()
    for epoch, updates in ((0, 3), (1, 6)):
        trackers.step(LogPoint(epoch, 3, 3, 0, updates, 2.0 - epoch, 0.1, 50.0, 0.25))
        trackers.epoch({"epoch": epoch, "train_loss": 1.5 - epoch, "eval_top1": "" if epoch == 0 else 60.0, "lr": 0.1})
    assert trackers.close(RunEnd("FINISHED", {})) == []
    assert said == [f"tracking: TensorBoard ({tmp_path / 'tensorboard'})"]
    found = scalars(tmp_path / "tensorboard")
    assert set(found) == {"step/loss", "step/lr", "step/img_per_sec", "step/data_wait", "train/loss", "eval/top1", "lr"}
    assert found["step/loss"] == [(3, 2.0), (6, 1.0)] and found["step/data_wait"] == [(3, 0.25), (6, 0.25)]
    assert found["train/loss"] == [(0, 1.5), (1, 0.5)]
    assert found["eval/top1"] == [(1, 60.0)]  # an epoch not validated has no point


def test_a_missing_package_stops_the_command_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an import of a missing package meets
    with pytest.raises(UsageError, match="--log-tensorboard needs the package tensorboard.*requirements-track.txt"):
        TensorBoardTracker(tmp_path / "tensorboard")
    assert not (tmp_path / "tensorboard").exists()
