"""benchmarks/recovery.py: the recovery task's figures agree with each other (its speeds are measured,
never asserted)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.command import RECOVERY_COLUMNS, build_parser, main
from benchmarks.measure import process_age
from benchmarks.options import BenchOptions
from benchmarks.recovery import WAYS, measure_recovery
from tests.conftest import REPO, device_flags
from vtools.cli.typed import typed_options
from vtools.errors import UsageError

TINY = [
    *("--model", "test_resnet", "--data", str(REPO / "data/fashion-mnist-mini"), "--tasks", "recovery"),
    *("--steps", "4", "--warmup", "1", "--repeats", "2", "--batch-size", "2", "--workers", "0"),
    *("--recovery-every", "2"),
]


def _options(argv: list[str]) -> BenchOptions:
    return typed_options(BenchOptions, build_parser().parse_args(argv))


def test_the_figures_of_each_way_agree(device: torch.device) -> None:
    """Three ways, one row each: a checkpoint every interval of each way's updates, the overhead computed
    from the medians of the stretches against no checkpoints, and a writer slower than the interval
    (a few MB/s against updates of milliseconds) makes the steps wait."""
    threads = torch.get_num_threads()
    try:
        options = _options([*TINY, "--recovery-slow-disk", "10", *device_flags(device.type)])
        rows = measure_recovery(options, process_age)
    finally:
        torch.set_num_threads(threads)
    by_way = {row["mode"]: row for row in rows}
    assert list(by_way) == list(WAYS)
    for row in rows:
        stretches = [float(ms) for ms in row["steps_ms"].split()]
        assert len(stretches) == 2 and row["updates"] == 8 and row["interval"] == 2
        assert row["step_ms"] == pytest.approx(statistics.median(stretches), abs=1e-3)
    none = by_way["none"]["step_ms"]
    assert "checkpoints" not in by_way["none"] and by_way["none"]["overhead_pct"] == 0
    for way in ("recovery", "slow-disk"):
        row = by_way[way]
        assert row["checkpoints"] == row["updates"] // row["interval"]
        assert row["overhead_pct"] == pytest.approx(100 * (row["step_ms"] / none - 1), abs=0.02)
        assert row["overhead_s_per_checkpoint"] == pytest.approx((row["step_ms"] - none) / 1000 * 2, abs=2e-4)
        assert row["state_mb"] > 0 and row["write_s"] > 0 and row["copy_s"] > 0 and row["write_cpu_s"] > 0
        spent = row["copy_s"] + row["wait_s"] + row["write_cpu_s"]
        assert row["cpu_cost_pct"] == pytest.approx(100 * spent / (2 * none / 1000), abs=0.01)
        half_interval = row["interval"] * row["step_ms"] / 1000 / 2
        assert row["lost_per_fault_s"] >= round(half_interval + row["write_s"] + row["startup_s"], 2) - 0.01
    assert by_way["recovery"]["disk_mbps"] is None and by_way["slow-disk"]["disk_mbps"] == 10
    assert by_way["recovery"]["state_mb"] == by_way["slow-disk"]["state_mb"]
    # at 10 MB/s a write of the state lasts state_mb / 10 s: far longer than an interval of updates
    assert by_way["slow-disk"]["write_s"] >= by_way["slow-disk"]["state_mb"] / 10 - 1e-3  # both rounded
    assert by_way["slow-disk"]["wait_s"] > 0


@pytest.mark.cpu_only(reason="the flags are refused before any device is resolved")
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--steps", "5"], "--steps 5 must be a multiple of --recovery-every 2"),
        (["--recovery-every", "1"], "--recovery-every must be 2 or more"),
        (["--recovery-slow-disk", "0"], "--recovery-slow-disk must be above 0"),
    ],
)
def test_the_recovery_flags_are_checked(flags: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        main([*TINY, *flags])


@pytest.mark.cpu_only(reason="checks the command's table and file; the measurement's devices are tested above")
def test_the_command_prints_its_own_table_and_writes_the_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recovery.csv"
    assert main([*TINY, "--device", "cpu", "--recovery-slow-disk", "50", "--output", str(out)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == RECOVERY_COLUMNS
    table = pd.read_csv(out)
    assert list(table["mode"]) == list(WAYS) and (table["task"] == "recovery").all()
    assert list(table["checkpoints"].isna()) == [True, False, False]
