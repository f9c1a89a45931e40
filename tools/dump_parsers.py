"""Every command's parser as JSON, flag by flag: what a change to how options are declared must keep.

Usage: python3 tools/dump_parsers.py > parsers.json, before and after a change, then diff the two. Each
command's parser comes from the command registry (vtools/cli/registry.py); nothing is run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _shown(value: Any) -> Any:
    """A JSON-able form of an action's attribute (types and callables by name)."""
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    if isinstance(value, (list, tuple)):
        return [_shown(item) for item in value]
    if isinstance(value, dict):
        return {key: _shown(item) for key, item in value.items()}
    return value


def action_record(action: argparse.Action) -> dict[str, Any]:
    """What a user meets of one flag: its spellings, where it lands, its default and how it reads values."""
    return {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "default": _shown(action.default),
        "type": _shown(action.type),
        "nargs": action.nargs,
        "const": _shown(action.const),
        "choices": _shown(list(action.choices)) if action.choices is not None else None,
        "metavar": _shown(action.metavar),
        "help": action.help,
        "kind": type(action).__name__,
        "resume": bool(getattr(action, "vtools_may_change_on_resume", False)),
    }


def dump() -> dict[str, list[dict[str, Any]]]:
    """Every registered command's flags, in its parser's order (--help left out)."""
    from vtools.cli import registry

    return {
        known.name: [action_record(a) for a in registry.build_parser(known.name)._actions if a.dest != "help"]
        for known in registry.COMMANDS
    }


if __name__ == "__main__":
    json.dump(dump(), sys.stdout, indent=1, sort_keys=True)
    print()
