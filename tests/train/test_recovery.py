"""Recovery checkpoints in one process: when they are due, how they are written and kept, which one
--resume auto continues, and what a resume says it trains again. Killed runs: tests/scripts/test_recovery.py."""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vtools.derived_options import interval_seconds
from vtools.options.values import recovery_interval
from vtools.train.checkpoint import LAST, CheckpointManager, recovery_files
from vtools.train.loop import UpdatePoint
from vtools.train.recovery import PROGRESS_NAME, ProgressMark, RecoverySchedule, recovery_saver
from vtools.train.resume import Position, _continue, has_checkpoint


def test_the_interval_is_a_count_of_updates_or_a_time_of_training() -> None:
    assert recovery_interval("500") == 500 and interval_seconds(500) is None
    assert [interval_seconds(recovery_interval(text)) for text in ("90s", "30m", "2h", "1.5h")] == [
        90.0,
        1800.0,
        7200.0,
        5400.0,
    ]
    for bad in ("-3", "30x", "m", "0m", "1e3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="900s, 30m, 2h"):
            recovery_interval(bad)


def test_a_count_schedule_is_due_every_n_updates_and_off_at_zero() -> None:
    assert RecoverySchedule.of(0, 1, torch.device("cpu")) is None
    schedule = RecoverySchedule.of(3, 1, torch.device("cpu"))
    assert [n for n in range(1, 13) if schedule.due(n)] == [3, 6, 9, 12]
    assert schedule.describe() == "every 3 updates"


def test_a_time_schedule_is_due_once_its_time_has_passed_and_only_at_check_points() -> None:
    schedule = RecoverySchedule.of("0.2s", 2, torch.device("cpu"))
    schedule.restart_clock()
    assert not schedule.due(2)  # too soon
    time.sleep(0.25)
    assert not schedule.due(3)  # not an update at which the ranks agree
    assert schedule.due(4)
    schedule.restart_clock()
    assert not schedule.due(6)
    assert schedule.describe() == "every 0.2 s of training"


def test_the_ranks_agree_on_a_time_interval_with_a_tensor_on_the_runs_device(monkeypatch, device) -> None:
    """NCCL and HCCL reduce device tensors only: the agreement's flag goes to the run's device."""
    import vtools.train.recovery as recovery

    asked: list[torch.device] = []
    monkeypatch.setattr(recovery, "any_rank", lambda flag, on: asked.append(on) or flag)
    schedule = RecoverySchedule.of("1h", 2, device)
    assert not schedule.due(2) and asked == [device]


def test_a_time_schedule_is_due_the_moment_its_interval_is_reached(monkeypatch) -> None:
    import vtools.train.recovery as recovery

    clock = iter([100.0, 100.25])
    monkeypatch.setattr(recovery, "time", SimpleNamespace(monotonic=lambda: next(clock)))  # this module's clock
    schedule = RecoverySchedule.of("0.25s", 1, torch.device("cpu"))
    schedule.restart_clock()  # at 100.0
    assert schedule.due(1)  # 0.25 s later, exactly the interval


def _state(value: float) -> dict:
    return {"state_dict": {"w": torch.full((4,), value)}, "optimizer": {}, "epoch": 0, "rng": {}}


def test_recovery_checkpoints_are_written_in_the_background_and_the_newest_k_kept(tmp_path: Path) -> None:
    written: list[str] = []
    manager = CheckpointManager(tmp_path, keep_recovery=2, on_write=lambda path: written.append(path.name))
    live = _state(1.0)
    for step in (3, 6, 9, 12):
        manager.save_recovery(live, 0, step)
        live["state_dict"]["w"].add_(1.0)  # training goes on changing the live weights during the write
    manager.wait()
    assert [path.name for path in recovery_files(tmp_path)] == ["recovery-0-9.pth.tar", "recovery-0-12.pth.tar"]
    saved = torch.load(tmp_path / "recovery-0-12.pth.tar", weights_only=True)
    assert torch.equal(saved["state_dict"]["w"], torch.full((4,), 4.0))  # the state when it was taken
    assert written == [f"recovery-0-{step}.pth.tar" for step in (3, 6, 9, 12)]  # each told to the ledger
    assert manager.recovery.count == 4 and manager.recovery.wait_seconds >= 0 and manager.recovery.copy_seconds > 0


def test_the_extra_file_a_kill_leaves_between_write_and_prune_goes_with_the_next_write(tmp_path: Path) -> None:
    """A SIGKILL after a recovery file is renamed into place but before the oldest is deleted leaves
    K + 1 of them; the next process's first recovery write (its ledger names the old ones) keeps K."""
    ledger = {f"recovery-0-{step}.pth.tar" for step in (3, 6, 9)}
    for name in ledger:
        torch.save(_state(0.0), tmp_path / name)
    manager = CheckpointManager(
        tmp_path, keep_recovery=2, on_write=lambda path: ledger.add(path.name), wrote_here=ledger.__contains__
    )
    manager.save_recovery(_state(1.0), 0, 12)
    manager.wait()
    assert [path.name for path in recovery_files(tmp_path)] == ["recovery-0-9.pth.tar", "recovery-0-12.pth.tar"]


def test_a_recovery_save_waits_for_the_write_in_flight_and_counts_the_wait(tmp_path: Path) -> None:
    """At most one write in flight: the next save waits for a slow one, and the wait is counted."""
    release = threading.Event()
    manager = CheckpointManager(tmp_path, on_write=lambda path: release.wait(1.0))
    manager.save_recovery(_state(1.0), 0, 1)  # its writer blocks in on_write for up to a second
    started = time.perf_counter()
    threading.Timer(0.3, release.set).start()
    manager.save_recovery(_state(2.0), 0, 2)
    assert time.perf_counter() - started >= 0.25
    assert manager.recovery.wait_seconds >= 0.25
    manager.wait()


def test_a_stop_checkpoint_waits_for_the_epoch_save_in_flight(tmp_path: Path) -> None:
    """A signal right after an epoch's save began: the stop checkpoint is written once that save is done,
    so the background write cannot land on top of the newer state."""
    release = threading.Event()
    in_background = lambda: threading.current_thread() is not threading.main_thread()  # noqa: E731
    manager = CheckpointManager(tmp_path, on_write=lambda path: in_background() and release.wait(1.0))
    manager.save(_state(1.0), epoch=0, metric=None)  # its writer blocks in on_write for up to a second
    threading.Timer(0.3, release.set).start()
    manager.save_interrupted({**_state(2.0), "epoch": 1})
    manager.wait()
    assert torch.equal(torch.load(tmp_path / LAST, weights_only=True)["state_dict"]["w"], torch.full((4,), 2.0))


def test_a_failed_recovery_write_is_raised_at_the_next_save(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "gone")
    manager.folder = tmp_path / "a-file"
    manager.folder.write_text("not a folder")
    manager.save_recovery(_state(1.0), 0, 1)
    with pytest.raises(Exception, match="could not write"):
        manager.wait()


def _write(path: Path, value: float, mtime: float) -> None:
    torch.save(_state(value), path)
    os.utime(path, (mtime, mtime))


def test_resume_auto_continues_the_newest_intact_checkpoint(tmp_path: Path) -> None:
    assert not has_checkpoint(tmp_path)
    _write(tmp_path / "last.pth.tar", 0.0, 1000)
    _write(tmp_path / "recovery-1-4.pth.tar", 1.0, 2000)
    _write(tmp_path / "recovery-1-8.pth.tar", 2.0, 3000)
    assert has_checkpoint(tmp_path)
    assert _continue(tmp_path, "").resume == tmp_path / "recovery-1-8.pth.tar"
    os.utime(tmp_path / "last.pth.tar", (4000, 4000))  # the epoch's end came after them
    assert _continue(tmp_path, "").resume == tmp_path / "last.pth.tar"
    (tmp_path / "last.pth.tar").write_bytes(b"cut short")  # a damaged newest: the next newest, said
    chosen = _continue(tmp_path, "")
    assert chosen.resume == tmp_path / "recovery-1-8.pth.tar"
    assert "skipping the damaged last.pth.tar" in chosen.note


def test_only_recovery_checkpoints_are_enough_to_continue(tmp_path: Path) -> None:
    """A run killed in its first epoch left no last.pth.tar."""
    _write(tmp_path / "recovery-0-5.pth.tar", 1.0, 1000)
    assert has_checkpoint(tmp_path) and _continue(tmp_path, "").resume == tmp_path / "recovery-0-5.pth.tar"


def test_the_progress_mark_says_how_many_updates_a_resume_trains_again(tmp_path: Path) -> None:
    mark = ProgressMark(tmp_path)
    assert mark.updates_reached() is None and mark.redone_note(10) == ""
    mark.write(0, 17, 17)
    assert mark.updates_reached() == 17
    assert mark.redone_note(15) == (
        "; the process before had reached update 17 at its last log step: 2 update(s) are trained again"
    )
    assert mark.redone_note(17) == "" and mark.redone_note(20) == ""
    (tmp_path / PROGRESS_NAME).write_text("not a mark")
    assert mark.updates_reached() is None


def test_only_recovery_checkpoints_a_run_wrote_are_pruned(tmp_path: Path) -> None:
    """A recovery-*.pth.tar a user put in the folder is not the run's to delete, however old."""
    foreign = tmp_path / "recovery-0-1.pth.tar"
    torch.save(_state(0.0), foreign)
    written: set[str] = set()
    manager = CheckpointManager(
        tmp_path, keep_recovery=1, on_write=lambda path: written.add(path.name), wrote_here=written.__contains__
    )
    for step in (3, 6):
        manager.save_recovery(_state(float(step)), 0, step)
    manager.wait()
    assert [path.name for path in recovery_files(tmp_path)] == ["recovery-0-1.pth.tar", "recovery-0-6.pth.tar"]


def _point(num_updates: int) -> UpdatePoint:
    return UpdatePoint(0, num_updates, num_updates, torch.tensor(2.5 * num_updates), 16 * num_updates)


@pytest.mark.parametrize("is_main", [True, False])
def test_the_saver_records_every_rank_at_due_updates_and_rank_0_writes(tmp_path: Path, is_main: bool) -> None:
    """Every rank records the state at the same due update (its streams are gathered into it); only rank 0
    writes the file."""
    recorded: list[tuple[Position, float, int]] = []

    def record(where: Position, result) -> dict:
        recorded.append((where, result.local_loss_sum, result.completed_steps))
        return _state(float(where.num_updates))

    manager = CheckpointManager(tmp_path, keep_recovery=5)
    save = recovery_saver(RecoverySchedule(2, None, 1, torch.device("cpu")), record, manager, is_main)
    for update in range(1, 6):
        save(_point(update))
    manager.wait()
    assert recorded == [(Position(0, 2, 2), 5.0, 2), (Position(0, 4, 4), 10.0, 4)]
    expected = ["recovery-0-2.pth.tar", "recovery-0-4.pth.tar"] if is_main else []
    assert [path.name for path in recovery_files(tmp_path)] == expected


def test_a_time_interval_counts_from_the_last_recovery_checkpoint(tmp_path: Path) -> None:
    schedule = RecoverySchedule(0, 0.2, 1, torch.device("cpu"))
    recorded: list[int] = []
    manager = CheckpointManager(tmp_path, keep_recovery=5)
    save = recovery_saver(schedule, lambda where, _: recorded.append(where.num_updates) or _state(0.0), manager, True)
    time.sleep(0.25)
    save(_point(1))  # the interval has passed: taken, and the clock starts again
    save(_point(2))  # at once after: not due
    manager.wait()
    assert recorded == [1]


def test_the_progress_mark_is_rewritten_without_waiting_for_the_disk(tmp_path: Path, monkeypatch) -> None:
    """The mark is rewritten at every log step: a flush to the disk there would stall training (an epoch
    checkpoint, written rarely, is flushed)."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    ProgressMark(tmp_path).write(0, 3, 3)
    assert ProgressMark(tmp_path).updates_reached() == 3 and synced == []
