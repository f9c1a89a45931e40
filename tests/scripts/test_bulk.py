"""``vtools bulk`` (timm's bulk_runner.py): validate.py or ``vtools benchmark`` over a list of models, a process
each, one results file, a failed model a row with its error, and a second run that skips what the file holds."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.conftest import DEVICE_TYPES, REPO, assert_usage_error, device_flags, run_script, write_model_folder

SHIPPED_VAL = REPO / "data" / "fashion-mnist-mini" / "val"
QUICK_BENCH = ["--bench", "inference", "-b", "2", "--num-warm-iter", "0", "--num-bench-iter", "1"]


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_benchmark_over_a_list_file_then_again_skipping_what_is_done(device_type: str, tmp_path: Path) -> None:
    """A file of names runs each at its pretrained input size, as timm's runner does (test_resnet's weights are
    160 px); the misspelt name is a row with its error. Run again, the measured model is not run twice and the
    failed one is tried again."""
    names = tmp_path / "models.txt"
    names.write_text("test_resnet\nno_such_model\n")
    results = tmp_path / "bulk.csv"
    args = ["-m", "vtools", "bulk", "--model-list", str(names), "--results-file", str(results), "benchmark.py"]
    args += [*QUICK_BENCH, *device_flags(device_type)]
    first = run_script(args)
    assert first.returncode == 0, first.stderr
    rows = rows_of(results)
    assert [row["model"] for row in rows] == ["test_resnet", "no_such_model"]
    assert rows[0]["infer_img_size"] == "160" and float(rows[0]["infer_samples_per_sec"]) > 0 and not rows[0]["error"]
    assert rows[0]["device"].split(":")[0] == device_type
    assert "no_such_model" in rows[1]["error"]
    again = run_script(args)
    assert again.returncode == 0, again.stderr
    assert "2 model run(s), 1 already in" in again.stdout and "test_resnet:" not in again.stdout
    assert [row["model"] for row in rows_of(results)] == ["test_resnet", "no_such_model"]
    assert rows_of(results)[0] == rows[0]  # the measured row kept as it was


@pytest.mark.cpu_only(reason="one process per model and the rows' order; the device paths: the test above")
def test_validate_over_model_folders_best_first(tmp_path: Path) -> None:
    """validate.py for each model folder of a list (no pretrained sizes: each runs as given), rows by top1."""
    classes = sorted(path.name for path in SHIPPED_VAL.iterdir())
    folders = [write_model_folder(tmp_path / f"m{seed}", len(classes), classes, seed=seed) for seed in (0, 1)]
    names = tmp_path / "models.txt"
    names.write_text("".join(f"{folder}\n" for folder in folders))
    results = tmp_path / "val.csv"
    args = ["-m", "vtools", "bulk", "--model-list", str(names), "--results-file", str(results), "validate.py"]
    proc = run_script([*args, str(SHIPPED_VAL), "--img-size", "32", "--device", "cpu", "--workers", "0"])
    assert proc.returncode == 0, proc.stderr
    rows = rows_of(results)
    assert sorted(row["model"] for row in rows) == sorted(str(folder) for folder in folders)
    assert float(rows[0]["top1"]) >= float(rows[1]["top1"]) and all(row["top5"] for row in rows)


@pytest.mark.cpu_only(reason="argument checks, before any model runs")
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--model-list", "zz_none*", "validate.py"], "--model-list zz_none*: neither all, all_in1k, all_res, a file"),
        (["--model-list", "all", "--no_python", "-m", "vtools"], "--no_python and --module exclude each other"),
    ],
)
def test_unusable_input_is_one_line(flags: list[str], words: str, tmp_path: Path) -> None:
    results = ["--results-file", str(tmp_path / "r.csv")]
    assert_usage_error(run_script(["-m", "vtools", "bulk", *results, *flags]), words)


@pytest.mark.cpu_only(reason="which planned runs a results file holds; nothing runs")
def test_a_resumed_run_tells_a_models_sizes_apart() -> None:
    """A row holds a run only at that run's size and crop (validate's columns, or benchmark's infer_ ones
    as json numbers): keyed by name alone, the model's second size would never be measured."""
    from vtools.commands.bulk import still_to_run

    small, large = ["--img-size", "160", "--crop-pct", "0.95"], ["--img-size", "192", "--crop-pct", "1.0"]
    runs = [("m", small), ("m", large), ("b", ["--img-size", "160"]), ("any", [])]
    rows = [
        {"model": "m", "img_size": "160", "crop_pct": "0.95"},
        {"model": "m", "img_size": "192", "crop_pct": "0.875"},  # another crop: not this run
        {"model": "b", "infer_img_size": 160},
        {"model": "any", "top1": "1"},
    ]
    assert still_to_run(runs, rows) == [("m", large)]


@pytest.mark.cpu_only(reason="the order of result rows; nothing runs")
def test_any_column_sorts_with_empty_cells_last() -> None:
    """Numbers best first whether csv text or json numbers, names A to Z, empty or null cells after them,
    failed rows last: a text column or one cpu leaves empty sorts instead of stopping the run."""
    from vtools.commands.bulk import ordered

    rows = [
        {"model": "c", "peak": ""},
        {"model": "a", "peak": None},
        {"model": "failed", "error": "boom"},
        {"model": "b", "peak": 3.5},
        {"model": "d", "peak": "12"},
    ]
    assert [row["model"] for row in ordered(rows, "peak")] == ["d", "b", "c", "a", "failed"]
    assert [row["model"] for row in ordered(rows, "model")] == ["a", "b", "c", "d", "failed"]
    assert [row["model"] for row in ordered(rows, "no_such_column")] == ["c", "a", "b", "d", "failed"]
