"""--early-stop-patience: the rule on scripted metric sequences (host logic), and whole train.py runs that
stop at the right epoch, then again at the right epoch after a resume that extends the patience."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from tests.conftest import DEVICE_TYPES, device_flags, run_script, summary, train_args
from vtools.train.early_stop import EarlyStop, early_stop_of

HOST_LOGIC = pytest.mark.cpu_only(reason="pure host logic on summary.csv rows; the device runs are below")


def rows_of(values: list[float | None], metric: str = "top1") -> list[dict[str, object]]:
    """summary.csv rows with ``values`` as eval_<metric> (None: an epoch --val-interval skipped)."""
    return [{"epoch": epoch, f"eval_{metric}": "" if value is None else value} for epoch, value in enumerate(values)]


def stop_epoch(rule: EarlyStop, values: list[float | None], num_epochs: int = 100) -> int | None:
    """The epoch after which the run stops, feeding the rule one saved epoch at a time as train.py does."""
    rows = rows_of(values, rule.metric)
    for end in range(1, len(rows) + 1):
        if rule.verdict(rows[:end], num_epochs):
            return end - 1
    return None


@HOST_LOGIC
def test_higher_is_better_stops_after_patience_validations_without_improvement() -> None:
    rule = EarlyStop("top1", patience=3, min_delta=0.0)
    assert stop_epoch(rule, [10.0, 20.0, 41.67, 41.67, 30.0, 41.0, 50.0]) == 5  # a tie does not improve
    assert stop_epoch(rule, [10.0, 20.0, 30.0, 40.0]) is None


@HOST_LOGIC
def test_loss_is_lower_is_better() -> None:
    rule = EarlyStop("loss", patience=2, min_delta=0.0)
    assert stop_epoch(rule, [2.0, 1.5, 1.0, 0.5, 0.25]) is None
    assert stop_epoch(rule, [2.0, 1.0, 1.5, 0.75, 0.8, 0.9, 0.1]) == 5
    assert stop_epoch(EarlyStop("top1", 2, 0.0), [2.0, 1.0, 1.5]) == 2  # the same values as a score


@HOST_LOGIC
def test_an_improvement_equal_to_min_delta_does_not_count() -> None:
    rule = EarlyStop("top1", patience=1, min_delta=0.5)
    assert stop_epoch(rule, [40.0, 40.5]) == 1  # exactly min_delta: not an improvement
    assert stop_epoch(rule, [40.0, 40.75, 41.5, 42.25]) is None  # more than min_delta each time
    lower = EarlyStop("loss", patience=1, min_delta=0.25)
    assert stop_epoch(lower, [1.0, 0.75]) == 1
    assert stop_epoch(lower, [1.0, 0.5, 0.125]) is None


@HOST_LOGIC
def test_the_reference_is_the_last_improvement() -> None:
    """As Keras and Lightning: small gains do not move the reference, so they add up against it."""
    assert stop_epoch(EarlyStop("top1", patience=3, min_delta=1.0), [40.0, 40.5, 40.75, 41.0]) == 3
    assert stop_epoch(EarlyStop("top1", patience=2, min_delta=1.0), [40.0, 40.75, 41.25]) is None


@HOST_LOGIC
def test_patience_counts_validations_not_epochs() -> None:
    rule = EarlyStop("top1", patience=2, min_delta=0.0)
    values = [50.0, None, None, 40.0, None, None, 45.0, None]  # --val-interval 3
    assert stop_epoch(rule, values) == 6
    assert "for 2 validated epoch(s) since 50 at epoch 0; stopped after epoch 6 of 100" in rule.verdict(
        rows_of(values[:7]), 100
    )


@HOST_LOGIC
def test_patience_zero_never_stops() -> None:
    assert early_stop_of("top1", 0, 0.0) is None
    assert stop_epoch(EarlyStop("top1", 0, 0.0), [50.0, 10.0, 10.0, 10.0, 10.0]) is None


@HOST_LOGIC
def test_no_stop_after_the_last_epoch() -> None:
    """The run ends there anyway: no early-stop line for an epoch that skips nothing."""
    rule = EarlyStop("top1", patience=1, min_delta=0.0)
    assert rule.verdict(rows_of([50.0, 10.0]), num_epochs=2) is None
    assert rule.verdict(rows_of([50.0, 10.0]), num_epochs=3) is not None


@HOST_LOGIC
def test_a_resume_reads_the_wait_back_from_summary_csv() -> None:
    """The rows before a resume come back as summary.csv text: the same stop epoch as one process."""
    rule = EarlyStop("top1", patience=3, min_delta=0.0)
    values = [10.0, 41.67, 30.0, None, 41.5, 20.0, 60.0]
    whole = stop_epoch(rule, values)
    assert whole == 5
    for split in range(1, len(values)):
        carried = read_back(rows_of(values[:split]))
        rows = carried + rows_of(values)[split:]
        stops = [end - 1 for end in range(split, len(rows) + 1) if rule.verdict(rows[:end], 100)]
        assert (stops[0] if stops else None) == whole, split


def read_back(rows: list[dict[str, object]]) -> list[dict[str, str]]:
    """``rows`` written to csv and read again, as vtools.train.resume.read_summary gives them."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return list(csv.DictReader(io.StringIO(text.getvalue())))


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_train_stops_early_then_again_after_a_resume(fashion4: Path, tmp_path: Path, device_type: str) -> None:
    """A min-delta no epoch can beat: patience 1 stops after epoch 1, and a resume with patience 3 remembers
    it has waited 1, so it stops after epoch 3; both exit 0 with the best model folder exported."""
    args = train_args(fashion4, tmp_path, "early", *device_flags(device_type), "--epochs", "6")
    args += ["--early-stop-min-delta", "1000"]
    first = run_script([*args, "--early-stop-patience", "1"])
    assert first.returncode == 0, first.stderr
    run = tmp_path / "early"
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("early stop: top1 has not improved by more than 1000 for 1 validated epoch(s)"), last
    assert last.endswith("stopped after epoch 1 of 6 (epochs count from 0)"), last
    assert len(summary(run)) == 2 and (run / "model").is_dir()
    again = run_script([*args, "--resume", "auto", "--early-stop-patience", "3"])
    assert again.returncode == 0, again.stderr
    last = again.stdout.strip().splitlines()[-1]
    assert "for 3 validated epoch(s) since " in last and last.endswith(
        "stopped after epoch 3 of 6 (epochs count from 0)"
    )
    assert [row["epoch"] for row in summary(run)] == ["0", "1", "2", "3"] and (run / "model").is_dir()
    assert "(2 epoch(s) in this process)" in again.stdout
