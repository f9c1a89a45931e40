"""``python -m vtools env``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.shared import DeviceFlags
from vtools.options.tools import EnvFlags

DESCRIPTION = """\
``vtools env``: print everything a device bug report needs (versions, devices, AMP policy, cpu
budget, environment variables); with ``--device`` it reports on that device and fails in one
line when it is unusable.
"""


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m vtools env", description=DESCRIPTION)
    changes = {"device": {"help": "device to report on (default: auto)"}}
    add_declared(parser, DeviceFlags, only=("device", "device_modules"), changes=changes)
    add_declared(parser, EnvFlags)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """env's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
