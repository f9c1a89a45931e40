"""Trackers on their own threads: a tracker that fails, hangs or is missing never stops or stalls the run.

The trackers here are small recording classes with the tracker interface, so that each failure (at the
start, in the middle, at the end, a start that never returns) happens at a chosen call; W&B and MLflow
themselves run against real stores and a real server in test_wandb_tracker.py and test_mlflow_tracker.py.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import file_permissions_can_apply, run_script
from vtools.observe.tracking import (
    TRACKING_FILE,
    Trackers,
    epoch_metrics,
    failure_text,
    step_metrics,
    tracker_package,
    tracking_id,
)
from vtools.run_events import LogPoint, RunEnd

pytestmark = pytest.mark.cpu_only(reason="the trackers' threads run on the host whatever the device")


class Recorder:
    """A tracker that records its calls, and fails (or hangs) at the call it is told to."""

    name = "Rec"
    where = "memory"

    def __init__(self, fail_at: str = "", hang_at: str = "", fail_with: BaseException | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_at, self.hang_at = fail_at, hang_at
        self.fail_with = fail_with or ConnectionError("server went away")
        self.release = threading.Event()

    def _call(self, name: str, payload: Any = None) -> None:
        label = f"{name}:{payload['epoch']}" if name == "epoch" else name
        if label == self.hang_at:
            self.release.wait(30)
        if label == self.fail_at:
            raise self.fail_with
        self.calls.append((name, payload))

    def start(self) -> None:
        self._call("start")

    def step(self, point: LogPoint) -> None:
        self._call("step", point)

    def epoch(self, row: dict[str, Any]) -> None:
        self._call("epoch", row)

    def result(self, row: dict[str, Any]) -> None:
        self._call("result", row)

    def end(self, end: RunEnd) -> None:
        self._call("end", end)


def point(epoch: int, step: int) -> LogPoint:
    return LogPoint(epoch, step, 4, 0, epoch * 4 + step, 2.0 - step / 10, 0.1, 50.0, 0.25)


def feed_run(trackers: Trackers, epochs: int = 3) -> None:
    """Two log steps and an epoch row per epoch, as train.py sends them."""
    for epoch in range(epochs):
        for step in (2, 4):
            trackers.step(point(epoch, step))
        trackers.epoch({"epoch": epoch, "train_loss": 1.5 - epoch / 10, "eval_top1": ""})


def test_a_working_tracker_gets_every_call_in_order_and_nothing_is_said() -> None:
    said: list[str] = []
    recorder = Recorder()
    trackers = Trackers([recorder], said.append)
    trackers.begin()
    feed_run(trackers)
    lines = trackers.close(RunEnd("FINISHED", {"best_epoch": 2}))
    assert lines == []
    assert said == ["tracking: Rec (memory)"]
    assert [name for name, _ in recorder.calls] == ["start"] + ["step", "step", "epoch"] * 3 + ["end"]
    assert recorder.calls[-1][1].summary == {"best_epoch": 2}


def test_a_tracker_that_fails_mid_run_is_given_up_with_one_warning_and_counted() -> None:
    said: list[str] = []
    recorder = Recorder(fail_at="epoch:1")
    trackers = Trackers([recorder], said.append)
    trackers.begin()
    feed_run(trackers)
    lines = trackers.close(RunEnd("FINISHED", {}))
    warnings = [line for line in said + lines if line.startswith("warning:")]
    assert warnings == [
        "warning: Rec (memory): not logging from epoch 1 on (ConnectionError: server went away); the run goes on"
    ]
    # epoch 0 and epoch 1's two steps got through; epoch 1's row, epoch 2 and the end did not
    assert [name for name, _ in recorder.calls] == ["start", "step", "step", "epoch", "step", "step"]
    assert lines[-1] == (
        "not logged to Rec (memory): 2 log step(s), 2 epoch row(s), the run's end (summary, tables, artifacts) "
        "(ConnectionError: server went away; from epoch 1 on)"
    )


@pytest.mark.parametrize(
    "error",
    [ModuleNotFoundError("No module named 'wandb' (pip install -r requirements-track.txt)"), SystemExit(1)],
    ids=["missing-package", "sys-exit"],
)
def test_a_tracker_that_cannot_start_costs_the_run_one_warning(error: BaseException) -> None:
    said: list[str] = []
    trackers = Trackers([Recorder(fail_at="start", fail_with=error)], said.append)
    trackers.begin()
    assert len(said) == 2 and said[1].startswith("warning: Rec (memory): not logging from the start on (could not")
    assert failure_text(error) in said[1]
    feed_run(trackers, epochs=1)
    lines = trackers.close(RunEnd("FINISHED", {}))
    assert lines == [
        f"not logged to Rec (memory): 2 log step(s), 1 epoch row(s), the run's end (summary, tables, artifacts) "
        f"(could not start: {failure_text(error)}; from the start on)"
    ]


def test_a_start_that_never_returns_is_bounded_and_the_end_does_not_wait_for_it() -> None:
    said: list[str] = []
    hanging = Recorder(hang_at="start")
    began = time.monotonic()
    trackers = Trackers([hanging, Recorder()], said.append, start_seconds=0.3)
    trackers.begin()
    assert time.monotonic() - began < 5
    assert (
        said[2]
        == "warning: Rec (memory): not logging from the start on (it had not started within 0.3 s); the run goes on"
    )
    feed_run(trackers, epochs=1)
    lines = trackers.close(RunEnd("FINISHED", {}), end_seconds=0.3)
    assert time.monotonic() - began < 5
    assert len(lines) == 1 and lines[0].startswith("not logged to Rec (memory): 2 log step(s), 1 epoch row(s)")
    hanging.release.set()  # the start returns late: the tracker stays given up and is sent nothing
    time.sleep(0.2)
    assert hanging.calls == [("start", None)]


def test_an_end_that_hangs_is_cut_at_the_wait_and_named() -> None:
    recorder = Recorder(hang_at="end")
    trackers = Trackers([recorder], lambda line: None)
    trackers.begin()
    feed_run(trackers, epochs=1)
    began = time.monotonic()
    lines = trackers.close(RunEnd("FINISHED", {}), end_seconds=0.3)
    assert time.monotonic() - began < 5
    assert lines[0].startswith("warning: Rec (memory): the run's end was not logged (it had not taken")
    assert lines[1].startswith("not logged to Rec (memory): the run's end (summary, tables, artifacts)")
    recorder.release.set()


def test_validation_results_are_counted_by_their_own_name() -> None:
    trackers = Trackers([Recorder(fail_at="result")], lambda line: None)
    trackers.begin()
    trackers.result({"model": "a", "top1": 50.0})
    lines = trackers.close(RunEnd("FINISHED", {}))
    assert "1 validation result(s)" in lines[-1] and "from the results of a on" in lines[-1]


def test_the_tracker_scope_ends_failed_when_an_exception_leaves_it() -> None:
    recorder = Recorder()
    with pytest.raises(ValueError), Trackers([recorder], lambda line: None):
        raise ValueError("validation broke")
    assert recorder.calls[-1][0] == "end" and recorder.calls[-1][1].status == "FAILED"


def test_figures_sent_are_host_numbers_named_as_tensorboard_names_them() -> None:
    assert step_metrics(point(0, 2)) == {
        "step/loss": 1.8,
        "step/lr": 0.1,
        "step/img_per_sec": 50.0,
        "step/data_wait": 0.25,
    }
    row = {"epoch": 3, "train_loss": 1.25, "eval_top1": "", "skipped_updates": 0, "flag": True, "name": "x"}
    assert epoch_metrics(row) == {"train_loss": 1.25, "skipped_updates": 0.0}


def test_a_missing_tracker_package_names_the_install() -> None:
    with pytest.raises(ModuleNotFoundError, match="requirements-track.txt"):
        tracker_package("vtools_no_such_tracker")


def test_the_tracking_id_is_written_once_and_kept(tmp_path: Path) -> None:
    wrote: list[tuple[Path, bool]] = []
    first = tracking_id(tmp_path, lambda path, created: wrote.append((path, created)))
    assert wrote == [(tmp_path / TRACKING_FILE, True)]
    assert json.loads((tmp_path / TRACKING_FILE).read_text()) == {"id": first}
    assert tracking_id(tmp_path, lambda path, created: wrote.append((path, created))) == first
    assert len(wrote) == 1
    (tmp_path / TRACKING_FILE).write_text("{damaged")
    second = tracking_id(tmp_path, lambda path, created: wrote.append((path, created)))
    assert second != first and len(second) == 16 and wrote[-1] == (tmp_path / TRACKING_FILE, False)


STORE_GOES_READ_ONLY = """
import os, sys, time
from pathlib import Path
from vtools.observe.mlflow_tracker import MlflowTracker
from vtools.observe.tracking import TrackedRun, Trackers
from vtools.run_events import RunEnd

folder = Path(sys.argv[1])
store = folder / "store"
store.mkdir()
run = TrackedRun("run", folder, "id0", False, {"model": "m"}, {})
trackers = Trackers([MlflowTracker(run, f"sqlite:///{store / 'm.db'}", "e", artifacts=False)], print)
trackers.begin()
trackers.epoch({"epoch": 0, "train_loss": 1.0})
while trackers.feeds[0].done["epoch"] < 1:
    time.sleep(0.05)
for path in store.iterdir():
    path.chmod(0o444)
store.chmod(0o555)  # what a full disk does to the store: its next write fails
for epoch in (1, 2):
    trackers.epoch({"epoch": epoch, "train_loss": 1.0 - epoch / 10})
for line in trackers.close(RunEnd("FINISHED", {})):
    print(line)
"""


@pytest.mark.slow
@pytest.mark.skipif(not file_permissions_can_apply(), reason="file modes cannot apply to this root (no setpriv)")
def test_a_store_that_stops_taking_writes_mid_run_is_one_warning_and_the_count(tmp_path: Path) -> None:
    """A real MLflow store (SQLite) that turns unwritable after epoch 0, as a full disk does."""
    proc = run_script(["-c", STORE_GOES_READ_ONLY, str(tmp_path)], file_permissions_apply=True, timeout=300)
    (tmp_path / "store").chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "not logging from epoch 1 on" in warnings[0], proc.stdout
    assert "readonly" in warnings[0].lower() or "read-only" in warnings[0].lower(), warnings[0]
    assert lines[-1].startswith("not logged to MLflow (sqlite:///") and "2 epoch row(s)" in lines[-1], lines[-1]


def test_a_failure_is_said_by_its_first_line_that_says_something() -> None:
    wrapped = RuntimeError("(raised as a result of autoflush)\n(sqlite3.OperationalError) attempt to write\n[SQL: x]")
    assert failure_text(wrapped) == "RuntimeError: (sqlite3.OperationalError) attempt to write"
    assert failure_text(ConnectionError("(only a remark)")) == "ConnectionError: (only a remark)"
    assert failure_text(TimeoutError()) == "TimeoutError"


def test_a_long_failure_keeps_its_start_and_its_end() -> None:
    err = ConnectionError("Max retries exceeded " + "x" * 400 + " [Errno 111] Connection refused")
    text = failure_text(err)
    assert len(text) <= 300 and text.startswith("ConnectionError: Max retries") and text.endswith("Connection refused")
