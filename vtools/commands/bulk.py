"""``vtools bulk``: run validate.py or ``vtools benchmark`` for each model of a list, each in a process of its
own, into one results file (timm's bulk_runner.py).

timm's flags and model lists: --model-list is a wildcard over timm's names (vit_*), all (with
--pretrained: the models that have weights), all_in1k or all_res, or a file of names, each then run at
its pretrained input size and crop (and at its test size where it has one), as timm's runner does. The
script and its arguments follow; ``--model NAME`` (and the size) is added per model. A model whose run
fails is a row with its error; the results file is rewritten after each model, and a bulk run started
again skips the models it already holds a row for (a failed one is tried again).

Examples:
  vtools bulk --model-list 'resnet1*' --results-file speeds.csv benchmark.py --bench inference
  vtools bulk --model-list models.txt --results-file val.csv validate.py /data/imagenet/val --pretrained
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vtools.cli.parser import OneLineParser
from vtools.cli.timm_compat import add_no_op
from vtools.errors import UsageError
from vtools.outputs import Output, check_outputs
from vtools.progress import progress
from vtools.results import write_rows

DEFAULT_RESULTS = "./results.csv"  # timm's
# the scripts a timm user names, as they run here (timm's benchmark.py is the vtools benchmark command)
SCRIPTS = {"benchmark.py": ["-m", "vtools", "benchmark"], "benchmark": ["-m", "vtools", "benchmark"]}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools bulk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-list", default="", metavar="NAME", help="a wildcard, all, all_in1k, all_res or a file")
    parser.add_argument("--results-file", default="", metavar="PATH", help=f"(default: {DEFAULT_RESULTS})")
    parser.add_argument("--sort-key", default="", metavar="COL", help="(default: the script's speed, or top1)")
    parser.add_argument("--pretrained", action="store_true", help="--model-list all: models with weights only")
    parser.add_argument("--delay", type=float, default=0, metavar="S", help="seconds between models (default: 0)")
    add_no_op(
        parser,
        "--start_method",
        default="spawn",
        choices=("spawn", "fork", "forkserver"),
        reason="each model runs in a new process started by the shell's rules (as in timm, where it is unused)",
    )
    parser.add_argument("--no_python", action="store_true", help="run the script as a program, not with python")
    parser.add_argument("-m", "--module", action="store_true", help="the script is a module (python -m)")
    parser.add_argument("script", help="validate.py, benchmark.py (vtools benchmark) or another script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def command(args: argparse.Namespace) -> list[str]:
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
    names = [line.strip() for line in listed.read_text().splitlines() if line.strip()]
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


def sort_key(args: argparse.Namespace) -> str:
    if args.sort_key:
        return args.sort_key
    if _is_benchmark(args):
        return "train_samples_per_sec" if any("train" in arg for arg in args.script_args) else "infer_samples_per_sec"
    return "top1"


def _is_benchmark(args: argparse.Namespace) -> bool:
    return "benchmark" in args.script or "benchmark" in args.script_args[:1]


def ordered(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Best first by ``key`` where every measured row has it (timm skips the sort otherwise), then failures."""
    measured = [row for row in rows if not row.get("error")]
    failed = [row for row in rows if row.get("error")]  # one pass each: rewritten after every model of a long list
    if all(key in row for row in measured):
        measured.sort(key=lambda row: float(row[key]), reverse=True)
    return measured + failed


def earlier_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a bulk run into ``path`` already wrote (none when it does not exist yet)."""
    if not path.is_file():
        return []
    if path.suffix == ".json":
        return json.loads(path.read_text())
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    base = command(args)
    results = Path(args.results_file or DEFAULT_RESULTS)
    fmt = "json" if results.suffix == ".json" else "csv"
    check_outputs([], [Output("--results-file", results)])
    runs = model_runs(args.model_list, args.pretrained, crop=not _is_benchmark(args))
    rows = [row for row in earlier_rows(results) if not row.get("error")]
    done = {row["model"] for row in rows}
    todo = [(model, extra) for model, extra in runs if model not in done]
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
