"""``python -m vtools plot``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.tools import PlotFlags

DESCRIPTION = """\
``vtools plot RUN [RUN ...]``: draw loss, top-1 and lr against epoch for training runs into one PNG.

Each RUN is a train.py run folder (or its summary.csv); train.py draws ``<run>/curves.png`` itself when it ends.
One run is drawn into its own curves.png (the picture train.py drew, brought up to date); several runs need
``-o``: a picture of several runs has no folder of its own, and a default name in the current folder would
replace whatever file had it.
"""


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m vtools plot", description=DESCRIPTION.split("\n\n")[0])
    add_declared(parser, PlotFlags)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """plot's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
