"""Every ``vtools`` command, listed once: its name and its line of help; its flags and its code are found
from its name.

``python3 -m vtools`` (its usage and dispatch), the runner (vtools/cli/runner.py) and the rules tests
(every command's parser generated from declarations) read this table; nothing else lists commands.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One command: ``summary`` is its line in ``vtools --help``. Every command has the same two halves:
    its flags module in vtools/cli/ (``<name>_flags.py``: ``build_parser()`` and ``parse(argv)``, torch-free,
    so its options are read and checked before torch loads) and its command module in vtools/commands/,
    whose ``run(options)`` takes the parse made typed (vtools/cli/typed.py)."""

    name: str
    summary: str

    @property
    def module(self) -> str:
        return f"vtools.commands.{self.name.replace('-', '_')}"  # avg-checkpoints: avg_checkpoints

    @property
    def flags(self) -> str:
        return f"vtools.cli.{self.name.replace('-', '_')}_flags"


COMMANDS: tuple[Command, ...] = (
    Command("train", "train a timm model from a YAML run file (train.py)"),
    Command("validate", "top-1 / top-5 of models on a labelled set (validate.py)"),
    Command("infer", "top-k predictions for images (inference.py)"),
    Command("env", "print versions, devices, AMP policy and environment for bug reports"),
    Command("export", "write a model as ONNX and check onnxruntime against PyTorch on real images"),
    Command("shards", "write an image folder as tar shards (or parquet) for --dataset wds/ (hfds/)"),
    Command("plot", "draw loss, top-1 and lr of one or several training runs into a PNG"),
    Command("compare", "set class reports side by side (validate.py --report, a run's eval/): which classes changed"),
    Command("parity", "run a model on two devices and name the first layer whose numbers differ beyond tolerance"),
    Command("avg-checkpoints", "average a run's best checkpoints into one set of weights (timm's avg_checkpoints.py)"),
    Command("clean-checkpoint", "a checkpoint's weights alone, hashed, for sharing (timm's clean_checkpoint.py)"),
    Command("benchmark", "a model's images per second, step time and peak memory on a device (timm's benchmark.py)"),
    Command(
        "bulk",
        "validate.py or benchmark over a list of models, a process each, one results file (timm's bulk_runner.py)",
    ),
)
ALIASES = {"inference": "infer"}  # timm's script name


def command(name: str) -> Command:
    """The command called ``name`` (or one of its aliases); KeyError for an unknown name."""
    name = ALIASES.get(name, name)
    found = next((known for known in COMMANDS if known.name == name), None)
    if found is None:
        raise KeyError(name)
    return found


def build_parser(name: str) -> argparse.ArgumentParser:
    """Command ``name``'s parser, as it parses (torch-free)."""
    return importlib.import_module(command(name).flags).build_parser()
