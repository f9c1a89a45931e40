"""``python -m vtools shards``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.shared import LoadingFlags
from vtools.options.tools import ShardsFlags

DESCRIPTION = """\
``python -m vtools shards FOLDER OUT``: write an image folder as tar shards (or parquet), atomically.

Shards follow the WebDataset layout timm reads (``<key>.jpg``/``.png``,
``<key>.cls``, ``<key>.json``) and come with a split-info file in timm's format
(``_info.json``: per split, its shard file names and sample counts) plus the
class names, so ``--dataset wds/NAME --data-dir OUT`` trains and validates
with no further flags. ``--format parquet`` writes the Hugging Face layout
(``data/<split>-00000-of-00001.parquet``, image and ClassLabel columns) for
``--dataset hfds/NAME``.

``--max-side N`` stores images re-encoded with their longer side at most N
(PNG stays PNG, the rest become JPEG): decoding full-size JPEGs is what limits
a fast accelerator, and random-resized crops of a 160-px-side copy rarely
need more. Without it, files are copied byte for byte.
"""


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m vtools shards", description=DESCRIPTION.split("\n\n")[0])
    add_declared(parser, ShardsFlags)
    changes = {"workers": {"help": "processes that re-encode images with --max-side (default: the usable cores)"}}
    add_declared(parser, LoadingFlags, only=("workers",), changes=changes)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """shards's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
