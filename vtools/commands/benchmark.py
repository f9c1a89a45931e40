"""``vtools benchmark``: a model's images per second, step time and peak memory, on any device (timm's benchmark.py).

The options are read before torch (vtools/cli/benchmark_flags.py, whose description says what is measured);
here the models are listed, measured one by one, and their rows written and printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vtools.cli.typed import typed_options
from vtools.errors import UsageError
from vtools.evaluation.speed import SpeedOptions, benchmark_model, check_optimizer, macs_counter
from vtools.options.declare import ParsedOptions
from vtools.outputs import Output, check_outputs
from vtools.results import write_rows
from vtools.runtime.options import RuntimeOptions
from vtools.runtime.resolve import setup_runtime

# the runtime options train.py has and timm's benchmark does not: its own defaults
NO_RUNTIME_TUNING = {
    "threads": None,
    "bind_cores": False,
    "device_settings": False,
    "device_kwargs": {},
    "model_dtype": None,
    "workers": 0,
}


def model_names(args: ParsedOptions) -> list[str]:
    """The models to measure, as timm picks them: --model-list (a file of names; here also a wildcard),
    --model all (timm's pretrained models), a --model wildcard, or the one --model."""
    import timm

    if args.model_list:
        listed = Path(args.model_list)
        if listed.is_file():
            return listed_names(listed)
        return _matching(args.model_list, "--model-list")
    if args.model == "all":
        return timm.list_models(pretrained=True, exclude_filters=["*in21k"])
    if any(mark in args.model for mark in "*?["):  # a wildcard
        return _matching(args.model, "--model")
    return [args.model]


def _matching(wildcard: str, flag: str) -> list[str]:
    import timm

    names = timm.list_models(wildcard)
    if not names:
        raise UsageError(f"{flag} {wildcard}: neither a file nor a wildcard matching any timm model")
    return names


def speed_options(args: ParsedOptions, amp_dtype: str | None) -> SpeedOptions:
    """The measured options; --amp sets --precision as timm does, to amp or amp_bfloat16 (``amp_dtype``)."""
    precision = args.precision
    if amp_dtype is not None:
        precision = "amp" if amp_dtype == "float16" else f"amp_{amp_dtype}"
    return typed_options(SpeedOptions, args, precision=precision)


def run(args: ParsedOptions) -> int:
    """Measure the models of the options the command line gave (parsed by vtools/cli/benchmark_flags.py)."""
    check_args(args)
    results = Path(args.results_file) if args.results_file else None
    check_list_apart(args.model_list, results)
    names = model_names(args)
    runtime = setup_runtime(typed_options(RuntimeOptions, args, **NO_RUNTIME_TUNING))
    options = speed_options(args, runtime.amp.dtype_name if runtime.amp.enabled else None)
    print(f"benchmarking {len(names)} model(s) on {runtime.device}, {options.precision}, --bench {options.bench}")
    rows = [_measured(name, options, runtime.device) for name in names]
    rows = _in_timm_order(rows, options.bench)
    if results is not None:
        write_rows(results, rows, args.results_format)
        print(f"wrote {results}")
    print(f"--result\n{json.dumps(rows if len(rows) > 1 else rows[0], indent=4)}")
    return 0


def check_args(args: ParsedOptions) -> ParsedOptions:
    """Every value a measurement would fail on, refused before the first model (each flag's range as the
    parser reads it, then these): a bad size or optimizer is the same mistake for every model, not a row of
    errors that exits 0."""
    if args.bench.startswith("profile") and macs_counter(args.bench) is None:
        raise UsageError(
            f"--bench {args.bench} counts MACs with deepspeed or fvcore, neither installed: pip install fvcore"
        )
    check_optimizer(args.opt)
    return args


def check_list_apart(model_list: str, results: Path | None) -> None:
    """Refuse a results file that is the --model-list file (it would be written over the names it was
    read from), or that cannot be written; shared with ``vtools bulk``."""
    listed = Path(model_list) if model_list and Path(model_list).is_file() else None
    check_outputs([("--model-list", listed)] if listed else [], [Output("--results-file", results)] if results else [])


def listed_names(path: Path) -> list[str]:
    """The model names of a --model-list file, one a line (blank lines skipped); shared with ``vtools
    bulk``. A file that is not text, or names nothing, is refused: there would be nothing to run."""
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (UnicodeDecodeError, OSError) as err:
        raise UsageError(f"--model-list {path}: not a text file of model names ({err.__class__.__name__})") from err
    if not names:
        raise UsageError(f"--model-list {path} names no model: write one model name a line")
    return names


def _measured(name: str, options: SpeedOptions, device: Any) -> dict[str, Any]:
    """One model's row, said in one line as it is measured."""
    row = {**benchmark_model(name, options, device), "device": str(device), "precision": options.precision}
    if "error" in row:
        print(f"{name}: failed: {row['error']}")
        return row
    parts = [
        f"{prefix} {row[f'{prefix}_samples_per_sec']} img/s ({row[f'{prefix}_step_time']} ms/step, "
        f"batch {row[f'{prefix}_batch_size']}, peak memory {_megabytes(row.get(f'{prefix}_peak_mem_mb'))})"
        for prefix in ("infer", "train")
        if f"{prefix}_samples_per_sec" in row
    ]
    if "infer_gmacs" in row:
        parts.append(f"{row['infer_gmacs']} GMACs")
    print(f"{name}: {'; '.join(parts) or 'counted'}, {row['param_count']} M params")
    return row


def _in_timm_order(rows: list[dict[str, Any]], bench: str) -> list[dict[str, Any]]:
    """Fastest first by timm's sort key (train speed where 'train' is in --bench, GMACs for profile, else
    inference speed), then the failed models in their order (timm leaves them out)."""
    key = (
        "train_samples_per_sec"
        if "train" in bench
        else "infer_gmacs"
        if "profile" in bench
        else "infer_samples_per_sec"
    )
    measured = sorted((row for row in rows if key in row), key=lambda row: row[key], reverse=True)
    return measured + [row for row in rows if key not in row]


def _megabytes(value: float | None) -> str:
    return f"{value} MB" if value is not None else "not measured on this device"
