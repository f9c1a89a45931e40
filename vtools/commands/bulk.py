"""``vtools bulk``: run validate.py or ``vtools benchmark`` for each model of a list, each in a process of its
own, into one results file (timm's bulk_runner.py).

Its options, and what ``--help`` says of it: vtools/cli/bulk_flags.py.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vtools.commands.benchmark import check_list_apart, listed_names
from vtools.errors import UsageError
from vtools.options.declare import ParsedOptions
from vtools.options.tools import DEFAULT_BULK_RESULTS
from vtools.progress import progress
from vtools.results import write_rows

DEFAULT_RESULTS = DEFAULT_BULK_RESULTS
# the scripts a timm user names, as they run here (timm's benchmark.py is the vtools benchmark command)
SCRIPTS = {name: ["-m", "vtools", name.removesuffix(".py")] for name in ("benchmark.py", "benchmark", "validate.py")}
# the row columns that report each per-run flag (benchmark prefixes its sizes with infer_ and train_)
RUN_COLUMNS = {"--img-size": ("img_size", "infer_img_size", "train_img_size"), "--crop-pct": ("crop_pct",)}


def command(args: ParsedOptions) -> list[str]:
    """The command line each model's process starts with (before --model and the sizes), as timm builds it."""
    if args.no_python and args.module:
        raise UsageError("--no_python and --module exclude each other: a module runs with python")
    if args.no_python:
        return [args.script, *args.script_args]
    if args.script in SCRIPTS and not Path(args.script).exists():
        return [sys.executable, "-u", *SCRIPTS[args.script], *args.script_args]
    return [sys.executable, "-u", *(["-m"] if args.module else []), args.script, *args.script_args]


def model_runs(model_list: str, pretrained: bool, crop: bool = True) -> list[tuple[str, list[str]]]:
    """(model, extra flags) per process, as timm's runner expands ``model_list``; without ``crop`` no
    --crop-pct (benchmark has none: timm's runner passes it and benchmark.py refuses it)."""
    import timm

    if model_list == "all":
        return [(name, []) for name in timm.list_models(pretrained=pretrained)]
    if model_list == "all_in1k":
        return _sized(timm.list_models(pretrained=True), classes=1000, both_sizes=True, crop=crop)
    if model_list == "all_res":
        return _sized(timm.list_models(), both_sizes=True, crop=False, every_tag=True)
    if not timm.is_model(model_list) and (names := timm.list_models(model_list)):
        return [(name, []) for name in names]
    listed = Path(model_list)
    if not listed.is_file():
        raise UsageError(f"--model-list {model_list}: neither all, all_in1k, all_res, a file nor a wildcard of models")
    names = listed_names(listed)
    return [run for name in names for run in (_sized([name], both_sizes=True, crop=crop) or [(name, [])])]


def _sized(
    names: list[str], classes: int | None = None, both_sizes: bool = False, crop: bool = True, every_tag: bool = False
) -> list[tuple[str, list[str]]]:
    """Each name at the input size (and crop) of its pretrained weights, and at their test size with
    ``both_sizes``; ``every_tag``: the sizes of all of an architecture's weights. A name without weights
    gives nothing (timm's runner leaves it out)."""
    from timm.models import get_arch_pretrained_cfgs, get_pretrained_cfg

    runs: set[tuple[str, int, float | None]] = set()
    for name in names:
        configs = list(get_arch_pretrained_cfgs(name).values()) if every_tag else [get_pretrained_cfg(name)]
        for config in (c for c in configs if c is not None and c.input_size is not None):
            if classes is not None and getattr(config, "num_classes", 0) != classes:
                continue
            runs.add((name, config.input_size[-1], config.crop_pct if crop else None))
            if both_sizes and config.test_input_size is not None:
                runs.add(
                    (name, config.test_input_size[-1], (config.test_crop_pct or config.crop_pct) if crop else None)
                )
    ordered_runs = sorted(runs, key=lambda run: (run[0], run[1], run[2] or 0))
    return [(name, _size_flags(size, pct)) for name, size, pct in ordered_runs]


def _size_flags(size: int, crop_pct: float | None) -> list[str]:
    return ["--img-size", str(size), *(["--crop-pct", str(crop_pct)] if crop_pct is not None else [])]


def run_one(base: list[str], model: str, extra: list[str], folder: Path) -> list[dict[str, Any]]:
    """One model's rows, from its process's results file (or the JSON after timm's ``--result`` line);
    a process that fails is one row with its last error line."""
    results = folder / "rows.json"
    results.unlink(missing_ok=True)
    argv = [*base, "--model", model, *extra, "--results-file", str(results), "--results-format", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode == 0 and results.is_file():
        found = json.loads(results.read_text())
    elif proc.returncode == 0 and "--result" in proc.stdout:
        found = json.loads(proc.stdout.split("--result")[-1])
    else:
        said = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        return [{"model": model, "error": said[-1] if said else f"exit code {proc.returncode}"}]
    return [{"model": model, **row} for row in (found if isinstance(found, list) else [found])]


def sort_key(args: ParsedOptions) -> str:
    if args.sort_key:
        return args.sort_key
    if _is_benchmark(args):
        return "train_samples_per_sec" if any("train" in arg for arg in args.script_args) else "infer_samples_per_sec"
    return "top1"


def _is_benchmark(args: ParsedOptions) -> bool:
    return "benchmark" in args.script or "benchmark" in args.script_args[:1]


def ordered(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Best first by ``key``: numbers highest first, then text from A to Z (a model's name), then rows with
    no value there (an empty peak memory on cpu), then the failed models: any column sorts, none is lost."""
    measured = [row for row in rows if not row.get("error")]
    failed = [row for row in rows if row.get("error")]  # one pass each: rewritten after every model of a long list
    return sorted(measured, key=lambda row: _rank(row.get(key))) + failed


def _rank(value: Any) -> tuple[int, float, str]:
    number = _number(value)
    if number is not None:
        return (0, -number, "")
    if value is None or str(value).strip().lower() in ("", "nan"):
        return (2, 0.0, "")
    return (1, 0.0, str(value))


def _number(value: Any) -> float | None:
    """``value`` as a finite number (a csv cell is text), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def earlier_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a bulk run into ``path`` already wrote (none when it does not exist yet). A file that is
    not such a table (no model column, not a list of rows, not text) is refused before any model runs,
    so that it is never written over."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            rows = json.loads(text) if text.strip() else []
        else:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            rows = list(reader)
            if reader.fieldnames and "model" not in reader.fieldnames:
                rows = None
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error) as err:
        raise _foreign(path, f"it cannot be read as {path.suffix[1:] or 'csv'}: {err.__class__.__name__}") from err
    if not isinstance(rows, list) or not all(isinstance(row, dict) and "model" in row for row in rows):
        raise _foreign(path, "it is not a list of rows with a model column")
    return rows


def _foreign(path: Path, why: str) -> UsageError:
    return UsageError(
        f"--results-file {path} is not a results file of vtools bulk ({why}); a bulk run would replace it: "
        "give a new path, or move the file away"
    )


def still_to_run(runs: list[tuple[str, list[str]]], rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The runs no measured row holds: a row is a run's when its model and every per-run flag (the input
    size, the crop) match, so a resumed run still measures a model's second size."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_model.setdefault(str(row["model"]), []).append(row)
    return [(model, extra) for model, extra in runs if not any(_holds(row, extra) for row in by_model.get(model, []))]


def _holds(row: dict[str, Any], extra: list[str]) -> bool:
    for flag, value in zip(extra[::2], extra[1::2]):
        found = next((_number(row[c]) for c in RUN_COLUMNS.get(flag, ()) if _number(row.get(c)) is not None), None)
        if found is None or not math.isclose(found, float(value), rel_tol=1e-6):
            return False
    return True


def check_script_args(args: ParsedOptions) -> None:
    """The arguments of vtools' own validate.py or benchmark checked here once, as the script would check
    them for every model: a data path that does not exist, a size or optimizer no model takes, would
    otherwise fail each model in turn, each after its own start-up."""
    script_args = args.script_args[1:] if args.module and args.script == "vtools" else args.script_args
    try:
        if _is_validate(args):
            from vtools.cli.validate_flags import parse
            from vtools.commands.validate import check_data_first

            check_data_first(parse(script_args))
        elif _is_benchmark(args):
            from vtools.cli.benchmark_flags import parse as parse_benchmark
            from vtools.commands.benchmark import check_args

            check_args(parse_benchmark(script_args))
    except UsageError as err:
        raise UsageError(f"{args.script}: {err} (so for every model; none was run)") from err


def _is_validate(args: ParsedOptions) -> bool:
    return Path(args.script).name in ("validate.py", "validate") or args.script_args[:1] == ["validate"]


def run(args: ParsedOptions) -> int:
    base = command(args)
    results = Path(args.results_file or DEFAULT_RESULTS)
    fmt = "json" if results.suffix == ".json" else "csv"
    check_list_apart(args.model_list, results)
    runs = model_runs(args.model_list, args.pretrained, crop=not _is_benchmark(args))
    check_script_args(args)
    if not args.model_list:
        print(f"no --model-list: all {len(runs)} timm models, as timm's bulk_runner runs them (--model-list picks)")
    rows = [row for row in earlier_rows(results) if not row.get("error")]
    todo = still_to_run(runs, rows)
    key = sort_key(args)
    print(f"{len(runs)} model run(s), {len(runs) - len(todo)} already in {results}: {' '.join(base)}; sort key {key}")
    with tempfile.TemporaryDirectory(prefix="vtools-bulk-") as folder:
        for index, (model, extra) in enumerate(progress(todo, desc="models")):
            if index and args.delay:
                time.sleep(args.delay)
            found = run_one(base, model, extra, Path(folder))
            rows += found
            print(f"{model}: " + ("; ".join(row["error"] for row in found if row.get("error")) or "done"))
            write_rows(results, ordered(rows, key), fmt)
    failed = [row for row in rows if row.get("error")]
    print(f"{len(rows) - len(failed)} row(s) measured, {len(failed)} failed: {results}")
    return 0
