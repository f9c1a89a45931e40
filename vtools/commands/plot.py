"""``vtools plot RUN [RUN ...]``: draw loss, top-1 and lr against epoch for training runs into one PNG.

Each RUN is a train.py run folder (or its summary.csv); train.py draws ``<run>/curves.png`` itself when it ends.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vtools.cli.parser import OneLineParser
from vtools.observe.curves import plot_runs, read_summary_rows


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m vtools plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders of train.py (or their summary.csv)")
    parser.add_argument("--output", "-o", default="curves.png", metavar="PNG", help="(default: curves.png)")
    args = parser.parse_args(argv)
    runs = [Path(run) for run in args.runs]
    for run in runs:
        read_summary_rows(run)  # every input checked before anything is drawn
    print(f"curves of {len(runs)} run(s) written to {plot_runs(runs, Path(args.output))}")
    sys.stdout.flush()
    return 0
