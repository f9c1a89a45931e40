"""Inputs and checks of bulk_benchmark.yaml: a model list, results files a bulk run wrote before (one with
the model at another input size), and files that are not such results."""

from __future__ import annotations

import csv
import re
import subprocess
from pathlib import Path

HEADER = "model,top1,img_size,crop_pct,infer_peak_mem_mb\n"
EARLIER = "zeta,70,160,0.95,5\nalpha,75,160,0.95,\n"  # measured before: peak memory empty (cpu) and not


def files(tmp: Path) -> None:
    """Every case's inputs (a few bytes each)."""
    (tmp / "models.txt").write_text("test_resnet\n")
    (tmp / "two.txt").write_text("test_resnet\ntest_vit\n")
    (tmp / "empty.txt").write_text("\n\n")
    (tmp / "object.json").write_text('{"model": "resnet50", "top1": 80.1}\n')
    (tmp / "broken.json").write_text('[{"model": "resnet50",\n')
    (tmp / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00model")
    (tmp / "no_model.csv").write_text("name,top1\nresnet50,80.1\n")
    (tmp / "header_only.csv").write_text("name,top1\n")  # a table of its own, still empty
    # test_resnet's weights are 160 px, crop 0.95: a row at 224 is another run of that model, one at 160 is this one
    (tmp / "other_size.csv").write_text(f"{HEADER}test_resnet,80,224,0.95,\n{EARLIER}")
    (tmp / "same_size.csv").write_text(f"{HEADER}test_resnet,80,160,0.95,\n{EARLIER}")


def _models_in_order(tmp: Path, expected: list[str], proc: subprocess.CompletedProcess) -> None:
    with (tmp / "other_size.csv").open(newline="") as handle:
        assert [row["model"] for row in csv.DictReader(handle)] == expected, proc.stdout


def by_model_name(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """The rows of earlier runs and the new one, A to Z, the failed run last: none lost."""
    _models_in_order(tmp, ["alpha", "test_resnet", "zeta", "test_resnet"], proc)


def by_peak_memory(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """The one row with a peak memory first, the rows without one after it in their order, then the failure."""
    _models_in_order(tmp, ["zeta", "test_resnet", "alpha", "test_resnet"], proc)


def every_model_said(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """Without --model-list the plan of all timm models is said, with their number, before anything else."""
    said = re.search(r"no --model-list: all (\d+) timm models", proc.stdout)
    assert said and int(said.group(1)) > 1000, proc.stdout


def measured_on_cpu_by_peak(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """Two models measured on cpu, where no peak memory is measured: both rows kept, speeds filled."""
    with (tmp / "speeds.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(row["model"] for row in rows) == ["test_resnet", "test_vit"], proc.stdout
    assert all(float(row["infer_samples_per_sec"]) > 0 and row["infer_peak_mem_mb"] == "" for row in rows)
