"""The benchmark runs and writes a table pandas reads (its figures are measured, never asserted)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.conftest import REPO, device_flags, run_script
from vtools.bench.measure import measure
from vtools.commands.bench import build_parser


@pytest.mark.cpu_only(
    reason="checks the report's rows and columns; the measured loops are the ones the npu tests "
    "run, and the data sources' device parity is in test_sources.py"
)
def test_benchmark_report(tmp_path: Path) -> None:
    """One run: model/vtools/baseline modes, vtools on folder, shards and parquet, the decode task on
    pre-resized shards, and whole train.py runs against the plain loop (recipe); every figure positive,
    ratios where they apply, a table pandas reads."""
    pytest.importorskip("datasets")
    out = tmp_path / "bench.csv"
    proc = run_script(
        [
            "-m",
            "vtools",
            "bench",
            "--model",
            "test_resnet",
            "--tasks",
            "validate",
            "recipe",
            "decode",
            "--sources",
            "folder",
            "wds",
            "parquet",
            "--max-side",
            "16",
            "--recipe-epochs",
            "1",
            "--recipe-precisions",
            "float32",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--batch-size",
            "4",
            "--workers",
            "0",
            "--output",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    rows = list(zip(table["task"], table["mode"], table["source"]))
    assert rows == [
        ("validate", "model", "folder"),
        ("validate", "vtools", "folder"),
        ("validate", "vtools", "wds"),
        ("validate", "vtools", "parquet"),
        ("validate", "baseline", "folder"),
        ("decode", "vtools", "folder"),
        ("decode", "vtools", "wds-max16"),
        ("recipe", "vtools", "folder"),
        ("recipe", "baseline", "folder"),
    ]
    recipe = table[table["task"] == "recipe"]
    assert (recipe["wall_s"] > 0).all() and recipe["top1"].between(0, 100).all()
    assert recipe.loc[recipe["mode"] == "vtools", "wall_vs_baseline"].notna().all()
    for column in ("img_per_sec", "data_wait", "startup_s", "peak_host_mib", "vs_model", "vs_baseline"):
        assert column in table.columns
    assert (table["img_per_sec"] > 0).all() and (table.loc[table["task"] != "recipe", "startup_s"] > 0).all()
    validate = table[table["task"] == "validate"]
    assert validate["data_wait"].between(0, 1).all()
    assert validate.loc[validate["mode"] == "vtools", ["vs_model", "vs_baseline"]].notna().all().all()


@pytest.mark.parametrize(
    "task, module, loop",
    [
        ("train", "vtools.train.loop", "train_one_epoch"),
        ("validate", "vtools.evaluation.loops", "evaluate"),
        ("inference", "vtools.evaluation.loops", "predict"),
    ],
)
@pytest.mark.parametrize("mode", ["vtools", "model"])
def test_bench_measures_the_real_loops(
    device: torch.device, task: str, module: str, loop: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each figure comes from the function the scripts run (train.py's train_one_epoch with its own
    loaders and components, validate.py's evaluate, inference.py's predict), fed every timed batch."""
    real = getattr(importlib.import_module(module), loop)
    seen: list[int] = []

    def spy(*args: object, **kwargs: object) -> object:
        batches = args[1]
        counted = Counting(batches)
        result = real(args[0], counted, *args[2:], **kwargs)
        if loop == "predict":  # a generator: the batches are taken as it is consumed
            result = list(result)
        seen.append(counted.count)
        return result

    monkeypatch.setattr(f"{module}.{loop}", spy)
    threads = torch.get_num_threads()
    argv = [
        "--model",
        "test_resnet",
        "--data",
        str(REPO / "data/fashion-mnist-mini"),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "4",
        "--workers",
        "0",
        *device_flags(device.type),
    ]
    try:
        row = measure(task, mode, "folder", build_parser().parse_args(argv))
    finally:
        torch.set_num_threads(threads)
    assert seen == [3], f"{loop} consumed {seen} batches, expected 3 (1 warm-up + 2 timed)"
    assert row["img_per_sec"] > 0 and row["device"].startswith(device.type)


class Counting:
    """An iterable that counts what the loop took from it (and keeps its length)."""

    def __init__(self, batches: object) -> None:
        self.batches, self.count = batches, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> object:
        for batch in self.batches:
            self.count += 1
            yield batch
