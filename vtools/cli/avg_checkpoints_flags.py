"""``avg-checkpoints``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.tools import CheckpointToolFlags

DESCRIPTION = """\
``vtools avg-checkpoints``: average a run's best checkpoints into one set of weights (timm's avg_checkpoints.py).

The checkpoints under --input that match --filter are ranked by the metric each was saved with and the
best -n are averaged (EMA weights where a checkpoint has them, unless --no-use-ema), in timm's arithmetic:
the result equals timm's script's bit for bit (num_batches_tracked as float32, as timm writes it; vtools'
loaders cast it back, as timm's do, so validate.py, inference.py and train.py --initial-checkpoint read
it). A checkpoint whose metric is NaN ranks nowhere (left out, and said); fewer matches than -n are all
averaged, and said.
In a vtools run folder only the files its run ledger lists count (another run's, a copied-in file or one
outside the folder is left out, and said). The weights go to --output as timm writes them (a state dict,
.pth or .safetensors), and with --model-folder also as a new model folder that validate.py and
inference.py take (the run's model/config.json beside them). Neither replaces an existing file or folder.

Examples:
  vtools avg-checkpoints --input runs/my-run --filter 'checkpoint-*.pth.tar' -n 3 --output avg.safetensors
  vtools avg-checkpoints --input runs/my-run -n 3 --safetensors --model-folder runs/my-run-avg3
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools avg-checkpoints", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = ("input", "filter", "output", "no_use_ema", "no_sort", "n", "safetensors", "model_folder")
    add_declared(parser, CheckpointToolFlags, only=names)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """avg-checkpoints's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
