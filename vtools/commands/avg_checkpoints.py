"""``vtools avg-checkpoints``: average a run's best checkpoints into one set of weights (timm's avg_checkpoints.py).

The checkpoints under --input that match --filter are ranked by the metric each was saved with and the
best -n are averaged (EMA weights where a checkpoint has them, unless --no-use-ema), in timm's arithmetic:
the result equals timm's script's bit for bit. In a vtools run folder only the files its run ledger lists
count (another run's or a copied-in file is left out, and said). The weights go to --output as timm
writes them (a state dict, .pth or .safetensors), and with --model-folder also as a model folder that
validate.py and inference.py take (the run's model/config.json beside them).

Examples:
  vtools avg-checkpoints --input runs/my-run --filter 'checkpoint-*.pth.tar' -n 3 --output avg.safetensors
  vtools avg-checkpoints --input runs/my-run -n 3 --safetensors --model-folder runs/my-run-avg3
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path

import torch

from vtools.atomic import atomic_copy
from vtools.cli.parser import OneLineParser
from vtools.errors import UsageError
from vtools.models.checkpoint_weights import (
    average_weights,
    checkpoint_metric,
    checkpoint_weights,
    read_training_checkpoint,
    sha256_of,
    write_weights,
)
from vtools.outputs import Output, check_outputs
from vtools.run_ledger import LOCK_NAME, read_ledger

DEFAULT_OUTPUT = "./averaged.pth"  # timm's, and ./averaged.safetensors with --safetensors


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools avg-checkpoints", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", default="", metavar="PATH", help="folder holding the checkpoints (default: .)")
    parser.add_argument("--filter", default="*.pth.tar", metavar="WILDCARD", help="(default: *.pth.tar)")
    parser.add_argument(
        "--output", default=DEFAULT_OUTPUT, metavar="PATH", help=f"the averaged state dict (default: {DEFAULT_OUTPUT})"
    )
    parser.add_argument("--no-use-ema", action="store_true", help="the plain weights even where EMA weights exist")
    parser.add_argument("--no-sort", action="store_true", help="average every match, not the best -n by metric")
    parser.add_argument("-n", type=int, default=10, metavar="N", help="checkpoints to average (default: 10)")
    parser.add_argument("--safetensors", action="store_true", help="write safetensors instead of torch.save")
    parser.add_argument(
        "--model-folder", default="", metavar="DIR", help="also write a model folder (needs the run's model/)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.n < 1:
        raise UsageError(f"-n must be 1 or more, got {args.n}")
    output = output_path(args.output, args.safetensors)
    folder = Path(args.input or ".")
    candidates = run_checkpoints(folder, args.filter)
    config = folder / "model" / "config.json"
    if args.model_folder and not config.is_file():
        raise UsageError(
            f"--model-folder: {folder} has no model/config.json to describe the weights (a vtools run has)"
        )
    outputs = [Output("--output", output)]
    if args.model_folder:
        outputs.append(Output("--model-folder", Path(args.model_folder), files=("config.json", "model.safetensors")))
    run_folder = [("--input", folder)] if (folder / LOCK_NAME).is_file() else []  # a run's folder is its own
    check_outputs([("a checkpoint", path) for path in candidates] + run_folder, outputs)
    chosen = choose(candidates, args.n, not args.no_sort)
    states = [checkpoint_weights(read_training_checkpoint(path), path, not args.no_use_ema) for path in chosen]
    averaged = average_weights(states)
    write_weights(averaged, output, args.safetensors)
    print(f"averaged {len(chosen)} checkpoint(s) into {output} (sha256 {sha256_of(output)})")
    if args.model_folder:
        as_trained = {key: value.to(states[0][key].dtype) for key, value in averaged.items()}  # counts: integers
        write_model_folder(as_trained, Path(args.model_folder), config)
        print(f"model folder: {args.model_folder} (validate.py --model {args.model_folder})")
    return 0


def output_path(output: str, safetensors: bool) -> Path:
    """--output as timm resolves it: .safetensors by default with --safetensors, the extension added where
    none is given; refused where a file is already there (nothing is written over)."""
    if safetensors and output == DEFAULT_OUTPUT:
        output = "./averaged.safetensors"
    stem, extension = os.path.splitext(output)
    path = Path(stem + (extension or (".safetensors" if safetensors else ".pth")))
    if path.exists():
        raise UsageError(f"--output {path} already exists: give a new name")
    return path


def run_checkpoints(folder: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` under ``folder`` (recursive ``**`` as in timm); in a vtools run folder
    only those its ledger lists."""
    if not folder.is_dir():
        raise UsageError(f"--input {folder} is not a folder")
    found = sorted(Path(path) for path in glob.glob(str(folder / pattern), recursive=True) if Path(path).is_file())
    if (folder / LOCK_NAME).is_file():
        listed = set(read_ledger(folder))
        ours = [path for path in found if path.relative_to(folder).as_posix() in listed]
        if len(ours) < len(found):
            left = ", ".join(path.name for path in found if path not in ours)
            print(f"left out {len(found) - len(ours)} file(s) the run's ledger does not list: {left}")
        found = ours
    if not found:
        raise UsageError(f"no checkpoint in {folder} matches --filter {pattern!r}")
    return found


def choose(paths: list[Path], count: int, by_metric: bool) -> list[Path]:
    """The best ``count`` by saved metric, in ascending order as timm sums them (or all, unsorted)."""
    if not by_metric:
        print("selected: " + ", ".join(str(path) for path in paths))
        return paths
    ranked = sorted(
        (metric, str(path))
        for path in paths
        if (metric := checkpoint_metric(read_training_checkpoint(path))) is not None
    )[-count:]
    if not ranked:
        raise UsageError("none of the matching checkpoints records a metric: give --no-sort to average them all")
    print("selected (metric, checkpoint): " + ", ".join(f"{metric:.4f} {name}" for metric, name in ranked))
    return [Path(name) for _, name in ranked]


def write_model_folder(state: dict[str, torch.Tensor], folder: Path, config: Path) -> None:
    """The averaged weights as model.safetensors beside the run's model config.json, each written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    write_weights(state, folder / "model.safetensors", safetensors=True)
    atomic_copy(config, folder / "config.json")
