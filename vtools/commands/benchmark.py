"""``vtools benchmark``: a model's images per second, step time and peak memory, on any device (timm's benchmark.py).

timm's flags, defaults and meanings: --bench inference, train, both (default) or profile (GMACs with
deepspeed or fvcore), synthetic batches at the model's input size, --num-warm-iter steps left out of
the timing, then --num-bench-iter timed; an out-of-memory error retries at a smaller batch (unless
--no-retry). Every step is timed to its end on the device (timm waits only on CUDA). One model, a
--model wildcard (resnet*), or --model-list: a file of names or a wildcard; a model that fails is a row
with its error. Rows go to --results-file (csv or json) and, after ``--result``, to stdout as JSON.

Examples:
  vtools benchmark --model resnet50 --device npu --amp
  vtools benchmark --model-list 'resnet1*' --bench inference --results-file speeds.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vtools.cli.options import add_device_choice
from vtools.cli.parser import KeyValuePairs, OneLineParser
from vtools.cli.timm_compat import add_refused
from vtools.cli.typed import typed_options
from vtools.errors import UsageError
from vtools.evaluation.speed import (
    BENCH_MODES,
    PRECISIONS,
    SpeedOptions,
    benchmark_model,
    check_optimizer,
    macs_counter,
)
from vtools.options.declare import NOT_NEGATIVE, Allowed
from vtools.outputs import Output, check_outputs
from vtools.results import write_rows
from vtools.runtime.options import RuntimeOptions
from vtools.runtime.resolve import setup_runtime

RESULT_FORMATS = ("csv", "json")  # timm's --results-format
# the runtime options train.py has and timm's benchmark does not: its own defaults
FVCORE = "pip install fvcore"
NO_RUNTIME_TUNING = {
    "threads": None,
    "bind_cores": False,
    "device_settings": False,
    "device_kwargs": {},
    "model_dtype": None,
    "workers": 0,
}
ONE_OR_MORE = Allowed(lambda v: v >= 1, "must be 1 or more")
# the values no model can be measured with, refused before any is (the declared ranges' wording)
RANGES = {
    "batch_size": ONE_OR_MORE,
    "num_bench_iter": ONE_OR_MORE,
    "num_warm_iter": NOT_NEGATIVE,
    "img_size": ONE_OR_MORE,
    "input_size": Allowed(lambda v: min(v) >= 1, "takes three sizes of 1 or more"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools benchmark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_argument_group("what is measured")
    group.add_argument("--model-list", default="", metavar="FILE|WILDCARD", help="models: a file of names, or resnet*")
    group.add_argument("--bench", default="both", choices=BENCH_MODES, help="(default: both)")
    group.add_argument("--detail", action="store_true", help="train: forward, backward and optimizer times apart")
    group.add_argument("--no-retry", action="store_true", help="out of memory: no retry at a smaller batch")
    group.add_argument("--results-file", default="", metavar="PATH", help="also write the rows here")
    group.add_argument("--results-format", default="csv", choices=RESULT_FORMATS, help="(default: csv)")
    group.add_argument("--num-warm-iter", type=int, default=10, metavar="N", help="untimed steps first (default: 10)")
    group.add_argument("--num-bench-iter", type=int, default=40, metavar="N", help="timed steps (default: 40)")
    group = parser.add_argument_group("model and input")
    group.add_argument("--model", "-m", default="resnet50", metavar="NAME", help="timm name, wildcard or all")
    group.add_argument("-b", "--batch-size", type=int, default=256, metavar="N", help="(default: 256)")
    group.add_argument("--img-size", type=int, default=None, metavar="N", help="(default: the model's)")
    group.add_argument("--input-size", type=int, nargs=3, default=None, metavar=("C", "H", "W"), help="e.g. 3 224 224")
    group.add_argument("--use-train-size", action="store_true", help="the model's train size, not its test size")
    group.add_argument("--num-classes", type=int, default=None, metavar="N", help="(default: the model's)")
    group.add_argument("--gp", default=None, metavar="POOL", help="global pool type (default: the model's)")
    group.add_argument("--channels-last", action="store_true", help="channels-last memory layout")
    group.add_argument("--grad-checkpointing", action="store_true", help="train: recompute activations")
    group.add_argument("--precision", default="float32", choices=PRECISIONS, help="(default: float32; --amp wins)")
    group.add_argument("--fast-norm", action="store_true", help="timm's fast normalization layers")
    group.add_argument("--reparam", action="store_true", help="reparameterize the model (RepVGG, MobileOne...)")
    group.add_argument(
        "--model-kwargs", nargs="*", default={}, action=KeyValuePairs, metavar="KEY=VALUE", help="for timm"
    )
    group.add_argument("--torchcompile-mode", default=None, metavar="MODE", help="torch.compile mode")
    group.add_argument("--torchcompile", nargs="?", const="inductor", default=None, metavar="BACKEND", help="compile")
    group = parser.add_argument_group("training step")
    group.add_argument("--opt", default="sgd", metavar="NAME", help="timm optimizer (default: sgd)")
    group.add_argument("--opt-eps", type=float, default=None, metavar="EPS", help="(default: the optimizer's)")
    group.add_argument("--opt-betas", type=float, nargs="+", default=None, metavar="BETA", help="(default: its own)")
    group.add_argument("--momentum", type=float, default=0.9, help="(default: 0.9)")
    group.add_argument("--weight-decay", type=float, default=0.0001, help="(default: 0.0001)")
    group.add_argument("--clip-grad", type=float, default=None, metavar="NORM", help="gradient clipping threshold")
    group.add_argument("--clip-mode", default="norm", choices=("norm", "value", "agc"), help="(default: norm)")
    group.add_argument("--smoothing", type=float, default=0.1, help="label smoothing (default: 0.1)")
    group.add_argument("--drop", type=float, default=0.0, help="dropout rate (default: 0)")
    group.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate")
    group.add_argument("--drop-block", type=float, default=None, help="DropBlock rate")
    add_device_choice(parser.add_argument_group("device and precision"))
    group = parser.add_argument_group("timm compatibility")
    reason = "removed from PyTorch (TorchScript and functorch's AOT fusion); use --torchcompile"
    add_refused(group, "--torchscript", action="store_true", default=False, reason=reason)
    add_refused(group, "--aot-autograd", action="store_true", default=False, reason=reason)
    add_refused(group, "--fuser", default="", reason="TorchScript's fusers went with TorchScript; use --torchcompile")
    return parser


def model_names(args: argparse.Namespace) -> list[str]:
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


def speed_options(args: argparse.Namespace, amp_dtype: str | None) -> SpeedOptions:
    """The measured options; --amp sets --precision as timm does, to amp or amp_bfloat16 (``amp_dtype``)."""
    precision = args.precision
    if amp_dtype is not None:
        precision = "amp" if amp_dtype == "float16" else f"amp_{amp_dtype}"
    return typed_options(SpeedOptions, args, precision=precision)


def main(argv: list[str] | None = None) -> int:
    args = check_args(build_parser().parse_args(argv))
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


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every value a measurement would fail on, refused before the first model: a bad size or optimizer
    is the same mistake for every model, not a row of errors that exits 0."""
    for name, allowed in RANGES.items():
        refusal = allowed.refusal(f"--{name.replace('_', '-')}", getattr(args, name))
        if refusal is not None:
            raise UsageError(refusal)
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
