"""timm's own argument parsers, rebuilt from the option list read out of timm's scripts.

tests/data/timm_options.json holds every ``add_argument`` of timm's train.py,
validate.py and inference.py (tools/extract_timm_options.py reads them from a
timm checkout; the file names the commit). Rebuilding the parsers from that
spec lets the tests parse a command line or an ``args.yaml`` exactly as timm's
scripts would, without the scripts (timm's wheel does not ship them).
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from timm.utils import ParseKwargs

OPTIONS_FILE = Path(__file__).parent / "data" / "timm_options.json"
SCRIPTS = ("train.py", "validate.py", "inference.py")
_TYPES = {"int": int, "float": float, "str": str}


@cache
def timm_spec() -> dict[str, Any]:
    return json.loads(OPTIONS_FILE.read_text(encoding="utf-8"))


def timm_options(script: str) -> list[dict[str, Any]]:
    """timm's options of ``script`` (train.py's -c/--config, which its separate config parser owns, left out)."""
    return [option for option in timm_spec()["scripts"][script] if option["flags"] != ["-c", "--config"]]


def long_flag(option: dict[str, Any]) -> str | None:
    """The option's longest flag (None for the positional data folder)."""
    flags = option["flags"]
    return max(flags, key=len) if flags[0].startswith("-") else None


def timm_parser(script: str) -> argparse.ArgumentParser:
    """An argparse parser with timm's flags, types, nargs, actions, choices and defaults for ``script``."""
    parser = argparse.ArgumentParser(prog=f"timm {script}")
    for option in timm_options(script):
        kwargs: dict[str, Any] = {"default": option["default"]}
        action = option.get("action")
        if isinstance(action, dict):  # timm's utils.ParseKwargs (key=value pairs into a dict)
            kwargs["action"] = ParseKwargs
        elif action:
            kwargs["action"] = action
        for key in ("nargs", "const", "choices"):
            if key in option:
                kwargs[key] = option[key]
        if "type" in option:
            kwargs["type"] = _TYPES[option["type"]]
        if option["flags"][0].startswith("-"):
            kwargs["dest"] = option["dest"]
        parser.add_argument(*option["flags"], **kwargs)
    return parser


def timm_args_yaml(script: str, argv: list[str]) -> str:
    """The args.yaml timm's train.py writes for ``argv``: every parsed option, as yaml.safe_dump gives it."""
    return yaml.safe_dump(vars(timm_parser(script).parse_args(argv)), default_flow_style=False)


def timm_reads_config(script: str, text: str) -> argparse.Namespace:
    """What timm's ``train.py -c FILE`` makes of a YAML file: its keys become parser defaults."""
    parser = timm_parser(script)
    parser.set_defaults(**yaml.safe_load(text))
    return parser.parse_args([])
