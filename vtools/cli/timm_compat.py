"""timm's flags that vtools accepts without acting on them: refused unless left at timm's default, or no-ops.

Every option of timm's train.py, validate.py and inference.py parses here, so a
timm command line or args.yaml never stops at an unknown flag. Most of them
work; the few that cannot mean anything here are declared with timm's own
spec (type, nargs, default) and one of two outcomes:

- *refused*: at timm's default the flag changes nothing, so the run goes on;
  any other value stops the run in one line that says why and what to use;
- *no-op*: what the flag changes in timm does not exist here (a loader
  prefetcher, pinned memory), so every value gives the same results.

Both are hidden from ``--help`` (which lists what works) and listed, with
their reasons, in the README's compatibility table.
"""

from __future__ import annotations

import argparse
from typing import Any

from vtools.errors import UsageError

# defaults that differ from timm's on purpose (the flag keeps timm's meaning for every value it is given)
DEFAULT_DEPARTURES: dict[str, str] = {
    "--device": "auto: the available accelerator, else cpu (timm's cuda stops on a machine without one)",
    "--amp-dtype": (
        "auto: bfloat16 where the device supports it (a CPU: natively, else float32), else float16 with a "
        "GradScaler (timm: float16)"
    ),
    "--channels-last": "auto: on for convolutional models on cpu, cuda and xpu, where it is faster (timm: off)",
    "--workers": "from the cpu budget: the cores the device leaves free, at most 8 (timm: 4, or 2 for inference)",
    "--model": "none: validate.py and inference.py need a model named (timm falls back to dpn92 / resnet50)",
}

_REFUSAL = "vtools_refusal"
_NO_OP = "vtools_no_op"
_TIMM_DEFAULT = "vtools_timm_default"  # kept apart from action.default, which a YAML file's -c values replace


def mark_refused(action: argparse.Action, reason: str) -> argparse.Action:
    """Make a flag one that only its (timm's) default may take here, hidden from ``--help``; ``reason`` says
    why and what to use instead."""
    action.help = argparse.SUPPRESS
    setattr(action, _REFUSAL, reason)
    setattr(action, _TIMM_DEFAULT, action.default)
    return action


def mark_no_op(action: argparse.Action, reason: str) -> argparse.Action:
    """Make a flag a no-op, hidden from ``--help``: every value gives the same results here (``reason``)."""
    action.help = argparse.SUPPRESS
    setattr(action, _NO_OP, reason)
    return action


def refused_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Flag -> reason, for every refused flag of ``parser``."""
    return {_name(action): getattr(action, _REFUSAL) for action in parser._actions if hasattr(action, _REFUSAL)}


def no_op_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Flag -> reason, for every accepted flag that changes nothing here."""
    return {_name(action): getattr(action, _NO_OP) for action in parser._actions if hasattr(action, _NO_OP)}


def check_refused(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop in one line when a refused flag has a value other than timm's default, whether the command line
    or a YAML file gave it (the file's values become the parser's defaults, so those are no reference)."""
    for action in parser._actions:
        if hasattr(action, _REFUSAL) and getattr(args, action.dest, None) != getattr(action, _TIMM_DEFAULT):
            given = f"{_name(action)} {_shown(getattr(args, action.dest))}".strip()
            raise UsageError(f"{given}: {getattr(action, _REFUSAL)}")


def _name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)
