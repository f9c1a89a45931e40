"""``clean-checkpoint``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.shared import ModelFlags
from vtools.options.tools import CheckpointToolFlags

DESCRIPTION = """\
``vtools clean-checkpoint``: a training checkpoint's weights alone, for sharing (timm's clean_checkpoint.py).

Keeps the state dict (the EMA weights where the checkpoint has them, unless --no-use-ema), drops the
optimizer, scheduler and every other entry, removes DDP and torch.compile prefixes and, with
--clean-aux-bn, split-BN training's auxiliary layers, and writes the rest as timm does: named after
--output (or, without it, after the checkpoint, in the current folder) with the first 8 hex digits of
the file's SHA-256 appended unless --no-hash, as .pth or, with --safetensors, .safetensors. The file is
written under a staging name of its own (``.<name>.<random>.tmp``) and linked into place only where no
file of its final name exists: nothing is ever written over.

Examples:
  vtools clean-checkpoint --checkpoint runs/my-run/model_best.pth.tar --output resnet50-mine.pth
  vtools clean-checkpoint --checkpoint runs/my-run/model_best.pth.tar --safetensors --no-hash
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools clean-checkpoint", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_declared(
        parser, ModelFlags, only=("checkpoint",), changes={"checkpoint": {"help": "the training checkpoint to clean"}}
    )
    changes = {"output": {"default": "", "help": "name (and folder) of the cleaned file"}}
    add_declared(
        parser,
        CheckpointToolFlags,
        only=("output", "no_use_ema", "no_hash", "clean_aux_bn", "safetensors"),
        changes=changes,
    )
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """clean-checkpoint's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
