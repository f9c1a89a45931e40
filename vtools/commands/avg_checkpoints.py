"""``vtools avg-checkpoints``: average a run's best checkpoints into one set of weights (timm's avg_checkpoints.py).

Its options, and what ``--help`` says of it: vtools/cli/avg_checkpoints_flags.py.
"""

from __future__ import annotations

import glob
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from vtools.atomic import atomic_copy, shared_file_mode
from vtools.errors import UsageError
from vtools.models.checkpoint_weights import (
    average_weights,
    check_same_model,
    check_weights_name,
    checkpoint_metric,
    checkpoint_weights,
    read_training_checkpoint,
    sha256_of,
    write_weights,
)
from vtools.options.declare import ParsedOptions
from vtools.options.tools import DEFAULT_AVERAGED
from vtools.outputs import Output, check_outputs
from vtools.run_ledger import LOCK_NAME, read_ledger

DEFAULT_OUTPUT = DEFAULT_AVERAGED  # timm's, and ./averaged.safetensors with --safetensors


def run(args: ParsedOptions) -> int:
    output = output_path(args.output, args.safetensors)
    folder = Path(args.input or ".")
    candidates = run_checkpoints(folder, args.filter)
    config = folder / "model" / "config.json"
    if args.model_folder:
        check_new_folder(Path(args.model_folder), config, folder)
    outputs = [Output("--output", output)]
    if args.model_folder:
        outputs.append(Output("--model-folder", Path(args.model_folder), files=("config.json", "model.safetensors")))
    run_folder = [("--input", folder)] if (folder / LOCK_NAME).is_file() else []  # a run's folder is its own
    check_outputs([("a checkpoint", path) for path in candidates] + run_folder, outputs)
    chosen = choose(candidates, args.n, not args.no_sort)
    states = [checkpoint_weights(read_training_checkpoint(path), path, not args.no_use_ema) for path in chosen]
    check_same_model(states, chosen)
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
    check_weights_name("--output", path, safetensors)
    return path


def check_new_folder(target: Path, config: Path, folder: Path) -> None:
    """--model-folder must be a new folder (another model's files would sit beside a config that no
    longer describes them), and the run must have the config.json that describes the weights."""
    if target.exists():
        raise UsageError(f"--model-folder {target} already exists: give a new folder name")
    if not config.is_file():
        raise UsageError(
            f"--model-folder: {folder} has no model/config.json to describe the weights (a vtools run has)"
        )


def run_checkpoints(folder: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` under ``folder`` (recursive ``**`` as in timm); in a vtools run folder
    only those its ledger lists, wherever ``pattern`` reaches them from (``../run/...``, an absolute path)."""
    if not folder.is_dir():
        raise UsageError(f"--input {folder} is not a folder")
    found = sorted(Path(path) for path in glob.glob(str(folder / pattern), recursive=True) if Path(path).is_file())
    if found and (folder / LOCK_NAME).is_file():
        found = ledger_listed(folder, found, pattern)
    if not found:
        raise UsageError(f"no checkpoint in {folder} matches --filter {pattern!r}")
    return found


def ledger_listed(folder: Path, found: list[Path], pattern: str) -> list[Path]:
    """The files of ``found`` that the run in ``folder`` lists; the others are named and left out, and
    none at all is one line (a run folder averages only its own checkpoints)."""
    listed = set(read_ledger(folder))
    home = Path(os.path.abspath(folder))
    ours = [path for path in found if _inside(path, home) in listed]
    left = [path for path in found if path not in ours]
    if not ours:
        raise UsageError(
            f"--filter {pattern!r} matches {len(found)} file(s), none of them a checkpoint the run in {folder} "
            f"lists (such as {left[0]}): a run folder averages its own checkpoints"
        )
    if left:
        print(f"left out {len(left)} file(s) the run's ledger does not list: {', '.join(path.name for path in left)}")
    return ours


def _inside(path: Path, home: Path) -> str | None:
    """``path`` relative to ``home`` with ``..`` steps taken (links are not followed: the ledger names
    the links a run made), or None for a path outside it."""
    absolute = Path(os.path.abspath(path))
    return absolute.relative_to(home).as_posix() if absolute.is_relative_to(home) else None


def choose(paths: list[Path], count: int, by_metric: bool) -> list[Path]:
    """The best ``count`` by saved metric, in ascending order as timm sums them (or all, unsorted). A NaN
    metric is left out (it would rank anywhere); fewer than ``count`` are all taken, and said."""
    if not by_metric:
        print("selected: " + ", ".join(str(path) for path in paths))
        return paths
    metrics = [(checkpoint_metric(read_training_checkpoint(path), path), str(path)) for path in paths]
    for why, left in (
        ("that record no metric", [name for metric, name in metrics if metric is None]),
        ("whose metric is NaN", [name for metric, name in metrics if metric is not None and math.isnan(metric)]),
    ):
        if left:
            print(f"left out {len(left)} checkpoint(s) {why}: {', '.join(Path(name).name for name in left)}")
    ranked = sorted((metric, name) for metric, name in metrics if metric is not None and not math.isnan(metric))
    if not ranked:
        raise UsageError("none of the matching checkpoints records a metric: give --no-sort to average them all")
    if len(ranked) < count:
        print(f"averaging {len(ranked)} of the {count} checkpoints -n asks for: only {len(ranked)} rank by metric")
    ranked = ranked[-count:]
    print("selected (metric, checkpoint): " + ", ".join(f"{metric:.4f} {name}" for metric, name in ranked))
    return [Path(name) for _, name in ranked]


def write_model_folder(state: dict[str, torch.Tensor], folder: Path, config: Path) -> None:
    """The averaged weights as model.safetensors beside the run's model config.json, written in a staging
    folder that is renamed into place: the folder appears whole, or not at all."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        write_weights(state, staging / "model.safetensors", safetensors=True)
        atomic_copy(config, staging / "config.json")
        staging.chmod(_folder_mode())  # mkdtemp makes it 0700; a model folder is for sharing
        os.rename(staging, folder)  # refused where a folder with files has appeared there meanwhile
    except OSError as err:
        raise UsageError(f"--model-folder {folder} could not be put in place ({err.strerror or err})") from err
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _folder_mode() -> int:
    """The mode mkdir gives a folder: the shared file mode, searchable where readable."""
    mode = shared_file_mode()
    return mode | (mode & 0o444) >> 2
