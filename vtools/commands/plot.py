"""``vtools plot RUN [RUN ...]``: draw loss, top-1 and lr against epoch for training runs into one PNG.

Its options, and what ``--help`` says of it: vtools/cli/plot_flags.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vtools.errors import UsageError
from vtools.options.declare import ParsedOptions
from vtools.outputs import Output, check_outputs


def run(args: ParsedOptions) -> int:
    from vtools.observe.curves import plot_runs, read_summary_rows  # torch and matplotlib: after the parse

    runs = [Path(run) for run in args.runs]
    for run in runs:
        read_summary_rows(run)  # every input checked before anything is drawn
    out = Path(args.output) if args.output else own_picture(runs)
    inputs = [read for run in runs for read in run_files(run)]
    own = not args.output  # one run's curves.png, redrawn from its summary: the run's file, brought up to date
    check_outputs(inputs, [Output("--output" if args.output else "the run's picture", out, refreshes_run_file=own)])
    print(f"curves of {len(runs)} run(s) written to {plot_runs(runs, out)}")
    sys.stdout.flush()
    return 0


def own_picture(runs: list[Path]) -> Path:
    """The default picture: one run's own curves.png; several runs have none."""
    if len(runs) > 1:
        raise UsageError(f"{len(runs)} runs are drawn into one picture: name it with -o PNG")
    return _folder(runs[0]) / "curves.png"


def run_files(run: Path) -> list[tuple[str, Path]]:
    """What drawing ``run`` reads: its summary.csv, and its config.yaml for the best epoch's metric."""
    summary = run / "summary.csv" if run.is_dir() else run
    return [(f"RUN {run}'s summary", summary), (f"RUN {run}'s config", _folder(run) / "config.yaml")]


def _folder(run: Path) -> Path:
    return run if run.is_dir() else run.parent
