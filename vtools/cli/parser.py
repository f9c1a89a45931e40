"""argparse with one-line errors, and the value checks every script runs before any device work."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from typing import Any, NoReturn

from vtools.cli.timm_compat import check_refused
from vtools.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2, no usage block), naming the closest real flag."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """Parse, then stop in one line on a timm flag that only its default may take here."""
        parsed = super().parse_args(args, namespace)
        check_refused(self, parsed)
        return parsed

    def error(self, message: str) -> NoReturn:
        raise UsageError(message + self._closest_flag(message))

    def _closest_flag(self, message: str) -> str:
        match = re.search(r"unrecognized arguments: (\S+)", message)
        if not match:
            return ""
        flag = match.group(1).split("=")[0]
        close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1, cutoff=0.6)
        return f" (did you mean {close[0]}?)" if close else ""


def check_values(args: argparse.Namespace) -> None:
    """Values argparse's types let through but no run can use: checked before any device or model work,
    for flags and YAML keys alike."""
    for name, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    for name in ("batch_size", "validation_batch_size", "img_size", "in_chans", "num_classes", "epochs"):
        check_positive(getattr(args, name, None), "--" + name.replace("_", "-"))
    if getattr(args, "workers", None) is not None and args.workers < 0:
        raise UsageError(f"--workers must be 0 (load in the main process) or more, got {args.workers}")
    if getattr(args, "profile", 0) < 0:
        raise UsageError(f"--profile must be 0 (off) or a number of steps, got {args.profile}")
    input_size = getattr(args, "input_size", None)
    if input_size is not None and min(input_size) <= 0:
        raise UsageError(
            f"--input-size needs three positive numbers (channels height width), got {' '.join(map(str, input_size))}"
        )
    channels = input_size[0] if input_size is not None else getattr(args, "in_chans", None)
    for name in ("mean", "std"):
        values = getattr(args, name, None)
        if values is None:
            continue
        if len(values) not in {1, 3, channels or 3}:
            raise UsageError(
                f"--{name} needs one value per input channel ({channels or 3}) or a single value, got {len(values)}"
            )
    if getattr(args, "std", None) is not None and min(abs(v) for v in args.std) == 0:
        raise UsageError("--std must not be 0: normalization divides by it")


def check_positive(value: int | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")
