"""argparse with one-line errors, and the value checks every script runs before any device work."""

from __future__ import annotations

import argparse
import ast
import difflib
import math
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from vtools.cli.timm_compat import check_refused
from vtools.errors import UsageError
from vtools.options.declare import DECLARATION


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2, no usage block), naming the closest real flag."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """Parse, then stop in one line on a timm flag that only its default may take here."""
        parsed = super().parse_args(args, namespace)
        check_refused(self, parsed)
        check_ranges(self, parsed)
        return parsed

    def error(self, message: str) -> NoReturn:
        raise UsageError(message + self._closest_flag(message))

    def _closest_flag(self, message: str) -> str:
        match = re.search(r"unrecognized arguments: (\S+)", message)
        if not match:
            return ""
        close = closest_name(match.group(1).split("=")[0], list(self._option_string_actions))
        return f" (did you mean {close}?)" if close else ""


# the usual spellings, in other tools, of what timm's option names shorten or order otherwise: a flag's words
# that match one (within two letters) are read as timm's (--learning-rate: --lr, --data-path: --data-dir)
SPELLED_OUT = {
    "learning-rate": "lr",
    "label-smoothing": "smoothing",
    "gradient-clipping": "clip-grad",
    "grad-clip": "clip-grad",
    "data-path": "data-dir",
    "data-root": "data-dir",
    "dropout": "drop",
    "optimizer": "opt",
    "scheduler": "sched",
    "gradient": "grad",
    "accumulation": "accum",
    "image": "img",
    "warmup": "warmup",  # warm-up, warm_up
}


def closest_name(given: str, names: list[str]) -> str | None:
    """The option name among ``names`` (flags or YAML keys) a mistyped ``given`` most likely means: first with
    its spelled-out words shortened as timm spells them (--lerning-rate: --lr, --optimiser: --opt), then the
    closest spelling of all; dashes and underscores count alike."""
    by_words = {_words(name): name for name in names}
    words = _words(given)
    shortened = _shortened(words)
    if shortened in by_words:
        return by_words[shortened]
    scored = [
        (difflib.SequenceMatcher(None, form, candidate).ratio(), name)
        for form in {words, shortened}
        for candidate, name in by_words.items()
    ]
    best = max(scored, default=(0.0, None))
    return best[1] if best[0] >= 0.6 else None


def _words(name: str) -> str:
    return name.lstrip("-").lower().replace("_", "-")


def _shortened(words: str) -> str:
    """``words`` (dash-joined) with each run of words that spells out one of :data:`SPELLED_OUT` replaced by
    timm's form, the longest run first; a run is compared without its dashes, so learningrate and warm-up
    match too."""
    parts, out, i = words.split("-"), [], 0
    while i < len(parts):
        runs = [
            (size, short)
            for long, short in SPELLED_OUT.items()
            for size in range(1, long.count("-") + 3)
            if i + size <= len(parts) and _near("".join(parts[i : i + size]), long.replace("-", ""))
        ]
        size, short = max(runs, key=lambda run: run[0], default=(1, parts[i]))
        out.append(short)
        i += size
    return "-".join(out)


def _near(text: str, word: str) -> bool:
    """At most two letters added, dropped or changed (a changed letter counts as two)."""
    matched = sum(block.size for block in difflib.SequenceMatcher(None, text, word).get_matching_blocks())
    return len(text) + len(word) - 2 * matched <= 2


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop in one line at the first number that is not finite, or value outside its flag's declared range
    (vtools/options/declare.py), whether a flag, a YAML key or a Python API keyword gave it."""
    for action in parser._actions:
        declared = getattr(action, DECLARATION, None)
        if declared is None:
            continue
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise UsageError(f"{declared.flags[0]} must be a finite number, got {value}")
        refusal = declared.allowed.refusal(declared.flags[0], value) if declared.allowed is not None else None
        if refusal is not None:
            raise UsageError(refusal)


def check_values(args: argparse.Namespace) -> None:
    """The rules no single flag's range can say, checked before any device or model work, for flags and
    YAML keys alike: the flags that describe the input agree with each other."""
    input_size = getattr(args, "input_size", None)
    in_chans = getattr(args, "in_chans", None)
    if input_size is not None and in_chans is not None and input_size[0] != in_chans:
        raise UsageError(
            f"--in-chans {in_chans} and --input-size {' '.join(map(str, input_size))} disagree on the number of "
            "input channels: give one of them"
        )
    channels = input_size[0] if input_size is not None else in_chans
    for name in ("mean", "std"):
        values = getattr(args, name, None)
        if values is None:
            continue
        if len(values) not in {1, channels or 3}:
            raise UsageError(
                f"--{name} needs one value per input channel ({channels or 3}) or a single value, got {len(values)}"
            )
    model_dtype = getattr(args, "model_dtype", None)
    if getattr(args, "amp", False) and model_dtype not in (None, "float32"):
        raise UsageError(
            f"--amp with --model-dtype {model_dtype}: autocast runs in lower precision over float32 weights, and "
            "--model-dtype casts the weights themselves; use one of them (timm refuses the pair as well)"
        )


class KeyValuePairs(argparse.Action):
    """``KEY=VALUE ...`` into a dict, each value read as a Python literal where it is one (``drop_rate=0.1``
    is a float) and kept as text otherwise: timm's ``timm.utils.ParseKwargs``, which imports torch."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        pairs: dict[str, Any] = {}
        for item in values or ():
            if not item:
                continue
            if "=" not in item:
                raise argparse.ArgumentError(self, f"expected KEY=VALUE, got {item!r}")
            key, text = item.split("=", 1)
            try:
                pairs[key] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                pairs[key] = text
        setattr(namespace, self.dest, pairs)
