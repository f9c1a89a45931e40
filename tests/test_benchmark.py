"""The benchmark runs and writes a table pandas reads (its figures are measured, never asserted)."""

from __future__ import annotations

import pytest

from pathlib import Path

import pandas as pd

from tests.conftest import run_script


@pytest.mark.cpu_only(reason="checks the report's columns; the measured loops are the ones the npu tests run")
def test_benchmark_writes_every_column(tmp_path: Path) -> None:
    out = tmp_path / "bench.csv"
    proc = run_script(["-m", "vtools", "bench", "--model", "test_resnet", "--tasks", "validate", "--steps", "1",
                       "--warmup", "1", "--batch-size", "4", "--workers", "0", "--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    assert list(table["mode"]) == ["model", "vtools", "baseline"]
    for column in ("img_per_sec", "data_wait", "startup_s", "peak_host_mib", "vs_model", "vs_baseline"):
        assert column in table.columns
    assert (table["img_per_sec"] > 0).all() and (table["startup_s"] > 0).all()
    assert table["data_wait"].between(0, 1).all()


@pytest.mark.cpu_only(reason="checks the report's rows; the data sources' device parity is in test_sources.py")
def test_benchmark_data_source_axis(tmp_path: Path) -> None:
    """Folder, shards and parquet are measured in one run, and the decode task reads pre-resized shards."""
    pytest.importorskip("datasets")
    out = tmp_path / "bench.csv"
    proc = run_script(["-m", "vtools", "bench", "--model", "test_resnet", "--tasks", "validate", "decode",
                       "--modes", "vtools", "baseline", "--sources", "folder", "wds", "parquet", "--max-side", "16",
                       "--steps", "1", "--warmup", "1", "--batch-size", "4", "--workers", "0", "--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    rows = list(zip(table["task"], table["mode"], table["source"]))
    assert rows == [("validate", "vtools", "folder"), ("validate", "vtools", "wds"), ("validate", "vtools", "parquet"),
                    ("validate", "baseline", "folder"), ("decode", "vtools", "folder"),
                    ("decode", "vtools", "wds-max16")]
    assert (table["img_per_sec"] > 0).all()
    assert table.loc[table["mode"] == "vtools", "vs_baseline"].notna().sum() == 3
