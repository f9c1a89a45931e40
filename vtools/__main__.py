"""``vtools <command>`` and ``python -m vtools <command>``: the scripts and the project's tools, from any folder."""

from __future__ import annotations

import difflib
import sys

from vtools.cli.runner import command_main, run_cli
from vtools.errors import UsageError

# command -> one line of help; each runs vtools/commands/<command>.py's main(argv)
COMMANDS: dict[str, str] = {
    "train": "train a timm model from a YAML run file (train.py)",
    "validate": "top-1 / top-5 of models on a labelled set (validate.py)",
    "infer": "top-k predictions for images (inference.py)",
    "env": "print versions, devices, AMP policy and environment for bug reports",
    "export": "write a model as ONNX and check onnxruntime against PyTorch on real images",
    "shards": "write an image folder as tar shards (or parquet) for --dataset wds/ (hfds/)",
    "plot": "draw loss, top-1 and lr of one or several training runs into a PNG",
    "compare": "set class reports side by side (validate.py --report, a run's eval/): which classes changed",
    "parity": "run a model on two devices and name the first layer whose numbers differ beyond tolerance",
    "avg-checkpoints": "average a run's best checkpoints into one set of weights (timm's avg_checkpoints.py)",
    "clean-checkpoint": "a checkpoint's weights alone, hashed, for sharing (timm's clean_checkpoint.py)",
    "benchmark": "a model's images per second, step time and peak memory on a device (timm's benchmark.py)",
    "bulk": "validate.py or benchmark over a list of models, a process each, one results file (timm's bulk_runner.py)",
}
ALIASES = {"inference": "infer"}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: vtools {{{','.join(COMMANDS)}}} [options]", ""]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "`vtools COMMAND --help` lists a command's options."]
    return "\n".join(lines)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = ALIASES.get(argv[0], argv[0]), argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, [*COMMANDS, *ALIASES], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown command {argv[0]!r} ({hint}available: {', '.join(COMMANDS)})")
    sys.argv[0] = f"vtools {command}"  # error lines and --help name the command
    return command_main(command)(rest)


def cli() -> None:
    """The ``vtools`` console command."""
    run_cli(_main)


if __name__ == "__main__":
    cli()
