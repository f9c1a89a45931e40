"""``vtools env``: print everything a device bug report needs (versions, devices, AMP policy, cpu
budget, environment variables); with ``--device`` it reports on that device and fails in one
line when it is unusable.
"""

from __future__ import annotations

import sys

from vtools.cli.parser import OneLineParser
from vtools.errors import fail
from vtools.observe.env_report import collect, format_report


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m vtools env", description=__doc__)
    parser.add_argument("--device", default="auto", help="device to report on (default: auto)")
    parser.add_argument("--device-modules", nargs="*", default=[], help="modules to import that register devices")
    args = parser.parse_args(argv)
    report = collect(args.device, tuple(args.device_modules or ()))
    print(format_report(report))
    sys.stdout.flush()
    if " unusable: " in str(report["device"]):
        fail(str(report["device"]), prog="python -m vtools env")
    return 0
