"""``compare``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.tools import CompareFlags

DESCRIPTION = """\
``vtools compare REPORT REPORT [...]``: class reports side by side, with each class's change.

Each REPORT is a folder written by ``validate.py --report`` or a train.py run
folder (its ``eval/``: the best epoch). Deltas are against the first REPORT,
in points: before and after fine-tuning, npu against cpu on the same weights.

Examples:
  vtools compare reports/before reports/after
  vtools compare runs/base runs/finetuned --output changes.csv
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools compare", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_declared(parser, CompareFlags)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """compare's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
