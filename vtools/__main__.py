"""``vtools <command>`` and ``python -m vtools <command>``: the scripts and the project's tools, from any folder."""

from __future__ import annotations

import difflib
import sys

from vtools.cli.registry import ALIASES, COMMANDS, command
from vtools.cli.runner import command_main, run_cli
from vtools.errors import UsageError


def _usage() -> str:
    names = [known.name for known in COMMANDS]
    width = max(map(len, names))
    lines = [f"usage: vtools {{{','.join(names)}}} [options]", ""]
    lines += [f"  {known.name:<{width}}  {known.summary}" for known in COMMANDS]
    lines += ["", "`vtools COMMAND --help` lists a command's options."]
    return "\n".join(lines)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    try:
        name = command(argv[0]).name
    except KeyError:
        names = [known.name for known in COMMANDS]
        close = difflib.get_close_matches(argv[0], [*names, *ALIASES], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown command {argv[0]!r} ({hint}available: {', '.join(names)})") from None
    sys.argv[0] = f"vtools {name}"  # error lines and --help name the command
    return command_main(name)(argv[1:])


def cli() -> None:
    """The ``vtools`` console command."""
    run_cli(_main)


if __name__ == "__main__":
    cli()
