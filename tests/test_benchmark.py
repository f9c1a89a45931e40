"""The benchmark runs and writes a table pandas reads (its figures are measured, never asserted)."""

from __future__ import annotations

import pytest

from pathlib import Path

import pandas as pd

from tests.conftest import run_script


@pytest.mark.cpu_only(reason="checks the report's rows and columns; the measured loops are the ones the npu tests "
                             "run, and the data sources' device parity is in test_sources.py")
def test_benchmark_report(tmp_path: Path) -> None:
    """One run: model/vtools/baseline modes, vtools on folder, shards and parquet, and the decode task on
    pre-resized shards; every figure positive, ratios where they apply, a table pandas reads."""
    pytest.importorskip("datasets")
    out = tmp_path / "bench.csv"
    proc = run_script(["-m", "vtools", "bench", "--model", "test_resnet", "--tasks", "validate", "decode",
                       "--sources", "folder", "wds", "parquet", "--max-side", "16",
                       "--steps", "1", "--warmup", "1", "--batch-size", "4", "--workers", "0", "--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    rows = list(zip(table["task"], table["mode"], table["source"]))
    assert rows == [("validate", "model", "folder"), ("validate", "vtools", "folder"), ("validate", "vtools", "wds"),
                    ("validate", "vtools", "parquet"), ("validate", "baseline", "folder"),
                    ("decode", "vtools", "folder"), ("decode", "vtools", "wds-max16")]
    for column in ("img_per_sec", "data_wait", "startup_s", "peak_host_mib", "vs_model", "vs_baseline"):
        assert column in table.columns
    assert (table["img_per_sec"] > 0).all() and (table["startup_s"] > 0).all()
    validate = table[table["task"] == "validate"]
    assert validate["data_wait"].between(0, 1).all()
    assert validate.loc[validate["mode"] == "vtools", ["vs_model", "vs_baseline"]].notna().all().all()
