"""The project tools' own options (``vtools env|plot|shards|compare|clean-checkpoint|avg-checkpoints|export|
bulk|parity``), each declared once; the flags they share with the scripts are the scripts' declarations
(vtools/options/shared.py), ranges included."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from vtools.options.declare import AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE, Allowed, no_op, option
from vtools.results import RESULT_FORMATS

# a sleep of a negative, infinite or NaN time fails only after the first model was measured: refused up front
DELAY = Allowed(lambda v: math.isfinite(v) and v >= 0, "must be a number of seconds, 0 or more")
DEFAULT_AVERAGED = "./averaged.pth"  # timm's avg_checkpoints.py output
DEFAULT_BULK_RESULTS = "./results.csv"  # timm's bulk_runner.py
# parity's tolerances by the device's compute dtype: (activations and the loss, gradients and updated weights)
DEFAULT_TOLERANCES = {"float32": (1e-4, 1e-3), "float16": (1e-2, 0.5), "bfloat16": (5e-2, 1.0)}


@dataclass(frozen=True, kw_only=True)
class EnvFlags:
    """``vtools env``: which device to report on, and whether to run the preflight."""

    title: ClassVar[str] = "report"

    check: bool = option(
        "--check",
        default=False,
        help="also run the preflight: every set-up problem and recommended setting, one line each with its fix; "
        "exit 2 when one would stop a run",
    )


@dataclass(frozen=True, kw_only=True)
class PlotFlags:
    """``vtools plot``: the runs drawn and where the picture goes."""

    title: ClassVar[str] = "plot"

    runs: list[str] = option(
        "runs", default=None, nargs="+", metavar="RUN", help="run folders of train.py (or their summary.csv)"
    )
    output: str = option(
        "--output", "-o", default="", metavar="PNG", help="(default: one RUN's own curves.png; several RUNs need it)"
    )


@dataclass(frozen=True, kw_only=True)
class ShardsFlags:
    """``vtools shards``: an image folder written as tar shards or parquet."""

    title: ClassVar[str] = "shards"

    source: str = option(
        "source",
        default=None,
        metavar="FOLDER",
        help="image folder: a root of split folders (train/, val/...) or one split's class folders",
    )
    out: str = option("out", default=None, metavar="OUT", help="output folder (must not exist, or be empty)")
    format: Literal["wds", "parquet"] = option(
        "--format",
        default="wds",
        help="tar shards for wds/NAME (default), or parquet for hfds/NAME",
    )
    name: str = option("--name", default="", help="dataset name in shard file names (default: OUT's name)")
    split: str | None = option("--split", default=None, help="FOLDER is this one split (default: find train/val/test)")
    shard_size: int = option(
        "--shard-size", default=1000, allowed=POSITIVE, metavar="N", help="samples per shard (default: 1000)"
    )
    max_side: int | None = option(
        "--max-side",
        default=None,
        allowed=POSITIVE,
        metavar="N",
        help="store images re-encoded with the longer side at most N pixels",
    )


@dataclass(frozen=True, kw_only=True)
class CompareFlags:
    """``vtools compare``: class reports side by side."""

    title: ClassVar[str] = "compare"

    reports: list[str] = option(
        "reports",
        default=None,
        nargs="+",
        metavar="REPORT",
        help="validate.py --report folders or train.py run folders",
    )
    top: int = option(
        "--top",
        default=5,
        allowed=NOT_NEGATIVE,
        metavar="N",
        help="classes listed as most improved / most worsened (default: 5)",
    )
    output: str = option(
        "--output", "-o", default="", metavar="PATH", help="write the per-class comparison here (one row per class)"
    )
    format: str = option("--format", default="csv", choices=RESULT_FORMATS, help="of --output (default: csv)")


@dataclass(frozen=True, kw_only=True)
class CheckpointToolFlags:
    """timm's clean_checkpoint.py and avg_checkpoints.py: which weights, and how they are written."""

    title: ClassVar[str] = "checkpoints"

    input: str = option("--input", default="", metavar="PATH", help="folder holding the checkpoints (default: .)")
    filter: str = option("--filter", default="*.pth.tar", metavar="WILDCARD", help="(default: *.pth.tar)")
    output: str = option(
        "--output",
        default=DEFAULT_AVERAGED,
        metavar="PATH",
        help=f"the averaged state dict (default: {DEFAULT_AVERAGED})",
    )
    no_use_ema: bool = option("--no-use-ema", default=False, help="the plain weights even where EMA weights exist")
    no_sort: bool = option("--no-sort", default=False, help="average every match, not the best -n by metric")
    n: int = option("-n", default=10, allowed=AT_LEAST_ONE, metavar="N", help="checkpoints to average (default: 10)")
    no_hash: bool = option("--no-hash", default=False, help="no SHA-256 digits in the file name")
    clean_aux_bn: bool = option("--clean-aux-bn", default=False, help="drop split-BN training's aux_bn layers")
    safetensors: bool = option("--safetensors", default=False, help="write safetensors instead of torch.save")
    model_folder: str = option(
        "--model-folder", default="", metavar="DIR", help="also write a new model folder (needs the run's model/)"
    )


@dataclass(frozen=True, kw_only=True)
class ExportFlags:
    """``vtools export``: an ONNX file, checked against PyTorch on real images."""

    title: ClassVar[str] = "export"

    model_name: str = option(
        "model_name", default=None, metavar="MODEL", help="model folder, or timm name (with --pretrained)"
    )
    format: Literal["onnx"] = option("--format", default="onnx", help="(default: onnx)")
    data: str = option(
        "--data",
        default=None,
        required=True,
        metavar="DIR",
        help="real images for the parity check (a folder, searched recursively)",
    )
    output: str = option("--output", default="", metavar="PATH", help="where to write (default: beside the weights)")
    opset: int = option("--opset", default=17, allowed=POSITIVE, help="ONNX opset (default: 17)")
    check_images: int = option(
        "--check-images", default=64, allowed=AT_LEAST_ONE, metavar="N", help="images compared (default: 64)"
    )
    atol: float = option(
        "--atol", default=1e-4, allowed=NOT_NEGATIVE, help="allowed absolute logit difference (default: 1e-4)"
    )
    rtol: float = option(
        "--rtol",
        default=1e-3,
        allowed=NOT_NEGATIVE,
        help="allowed difference relative to the largest logit (default: 1e-3)",
    )


@dataclass(frozen=True, kw_only=True)
class BulkFlags:
    """timm's bulk_runner.py: a script over a list of models, a process each."""

    title: ClassVar[str] = "bulk"

    model_list: str = option(
        "--model-list", default="", metavar="NAME", help="a wildcard, all, all_in1k, all_res or a file"
    )
    results_file: str = option("--results-file", default="", metavar="PATH", help=f"(default: {DEFAULT_BULK_RESULTS})")
    sort_key: str = option("--sort-key", default="", metavar="COL", help="(default: the script's speed, or top1)")
    pretrained: bool = option("--pretrained", default=False, help="--model-list all: models with weights only")
    delay: float = option("--delay", default=0, allowed=DELAY, metavar="S", help="seconds between models (default: 0)")
    start_method: str = no_op(
        "--start_method",
        default="spawn",
        choices=("spawn", "fork", "forkserver"),
        reason="each model runs in a new process started by the shell's rules (as in timm, where it is unused)",
    )
    no_python: bool = option("--no_python", default=False, help="run the script as a program, not with python")
    module: bool = option("-m", "--module", default=False, help="the script is a module (python -m)")
    script: str = option("script", default=None, help="validate.py, benchmark.py (vtools benchmark) or another script")
    script_args: list[str] = option("script_args", default=None, nargs=argparse.REMAINDER, help="its arguments")


@dataclass(frozen=True, kw_only=True)
class ParityFlags:
    """``vtools parity``: the two devices, the steps, the tolerances and the table."""

    title: ClassVar[str] = "parity"

    model_name: str | None = option(
        "model_name", default=None, nargs="?", metavar="MODEL", help="timm name, hf-hub:..., or model folder"
    )
    against: str = option("--against", default="cpu", metavar="SPEC", help="the reference device (default: cpu)")
    steps: int = option(
        "--steps",
        default=1,
        allowed=AT_LEAST_ONE,
        metavar="N",
        help="training steps compared (SGD, momentum 0.9; with --train train.py's) (default: 1)",
    )
    tol: float | None = option(
        "--tol",
        default=None,
        allowed=NOT_NEGATIVE,
        help="allowed max relative error of each activation and the loss (default: by the device's compute dtype)",
    )
    grad_tol: float | None = option(
        "--grad-tol",
        default=None,
        allowed=NOT_NEGATIVE,
        help="allowed max relative error of each gradient and updated weight (default: by the compute dtype)",
    )
    train: list[str] | None = option(
        "--train",
        default=None,
        nargs=argparse.REMAINDER,
        metavar="TRAIN_ARGS",
        help="no MODEL: compare train.py's own step; every flag but the ones above is train.py's (-c RUN.yaml, ...)",
    )
    data: str | None = option(
        "--data", default=None, metavar="DIR", help="real images for the batch (default: a seeded random batch)"
    )
