"""benchmarks/scale.py: the scale task times a script to its first batch, computes its ratios, refuses
bad sizes, and writes its table, CSV and plot end to end; the figures themselves are measured, never
asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.command import main
from benchmarks.file_tree import MARKER
from benchmarks.scale import FIRST_BATCH, add_scale_ratios, first_batch, parse_sizes
from tests.conftest import REPO
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="measures host processes and files; runs nothing on a device")


def test_a_scripts_first_batch_is_timed_and_the_script_stopped() -> None:
    talking = (
        "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.5: pass\n"
        "print('starting'); print('e 0 step 1/9 loss 2.3 lr 0.1', flush=True); time.sleep(600)"
    )
    done = first_batch([sys.executable, "-c", talking], FIRST_BATCH["train"])
    assert 0.5 <= done.seconds < 60 and 0.45 <= done.cpu_seconds <= done.seconds + 0.1 and done.mib > 1
    with pytest.raises(UsageError, match="ended before its first batch: no dataset here"):
        first_batch([sys.executable, "-c", "print('no dataset here')"], FIRST_BATCH["validate"])


def test_the_ratios_are_vtools_over_timm_on_the_same_size() -> None:
    rows = [
        {"mode": "vtools", "files": 10, "scan_s": 1.0, "index_mib": 2.0, "worker_growth_mib": 0.5},
        {"mode": "timm", "files": 10, "scan_s": 4.0, "index_mib": 8.0, "worker_growth_mib": 2.0},
        {"mode": "vtools", "files": 20, "scan_s": 3.0, "index_mib": 3.0, "worker_growth_mib": 1.0},
        {"mode": "timm", "files": 20, "scan_s": 2.0, "index_mib": 6.0, "worker_growth_mib": 0.0},
    ]
    rows[2].update(train_first_s=1.0, train_first_mib=12.0)
    add_scale_ratios(rows)
    assert (rows[0]["scan_vs_timm"], rows[0]["index_vs_timm"], rows[0]["worker_vs_timm"]) == (0.25, 0.25, 0.25)
    assert rows[2]["scan_vs_timm"] == 1.5 and rows[2]["index_vs_timm"] == 0.5
    assert rows[2]["train_s_vs_timm_scan"] == 0.5 and rows[2]["train_mib_vs_timm_index"] == 2.0
    assert "worker_vs_timm" not in rows[2]  # timm's growth was 0: no ratio
    assert "scan_vs_timm" not in rows[1]


@pytest.mark.parametrize("sizes", ["0", "abc", "100,,-5", ""])
def test_bad_sizes_are_refused_in_one_line(sizes: str) -> None:
    with pytest.raises(UsageError, match="--scale-sizes"):
        main(["--tasks", "scale", "--scale-sizes", sizes])


def test_sizes_are_read_with_separators() -> None:
    assert parse_sizes("10000, 100_000,300000") == [10_000, 100_000, 300_000]


@pytest.mark.slow
def test_the_scale_task_end_to_end(tmp_path: Path) -> None:
    """Two tiny sizes through the bench command: the table, one CSV row per size and reader with
    positive figures, vtools' scripts to their first batch, and the plot."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "benchmarks", "--tasks", "scale", "--scale-sizes", "200,600"]
    command += ["--scale-trees", str(tmp_path / "trees"), "--scale-dir", str(out), "--device", "cpu"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert [line[:3] for line in lines if line[:1] == ["scale"]] == [
        ["scale", "vtools", "200"],
        ["scale", "timm", "200"],
        ["scale", "vtools", "600"],
        ["scale", "timm", "600"],
    ]
    table = pd.read_csv(out / "scale.csv")
    assert list(zip(table["files"], table["mode"])) == [(200, "vtools"), (200, "timm"), (600, "vtools"), (600, "timm")]
    assert list(table["classes"]) == [2, 2, 6, 6]
    assert (table["scan_s"] > 0).all() and (table["heap_mib"] > 0).all()
    # a few hundred paths move the resident memory by less than the page-level noise (it can shrink):
    # measured, not signed
    assert table["index_mib"].abs().lt(20).all() and table["worker_growth_mib"].abs().lt(20).all()
    ours = table[table["mode"] == "vtools"]
    for column in ("train_first_s", "train_first_cpu_s", "validate_first_mib", "validate_first_cpu_s", "scan_vs_timm"):
        assert ours[column].notna().all(), column
    assert table[table["mode"] == "timm"]["train_first_s"].isna().all()
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "trees" / "files-10-classes-10" / MARKER).is_file()
