"""What the scripts' flags accept: their choices, value types and actions, without importing torch.

The parsers are built before torch, timm or the data libraries are imported (vtools/cli/runner.py), so
that ``--help`` and a mistyped flag answer at once. The choices below are therefore written out here as
strings; each names the values of a library constant that acts on them (``vtools.runtime.amp.AMP_DTYPES``
and the others listed in tests/cli/test_runner.py, which keeps each pair equal).
"""

from __future__ import annotations

import argparse

from vtools.derived_options import DURATION_UNITS

# more intra-op threads than any host has cores only slows a run down, and far more cannot be started
MAX_THREADS = 1024

KEY_VALUE_PAIRS = "key=value pairs"  # the argparse action (vtools.cli.parser.KeyValuePairs) of KEY=VALUE lists

AMP_DTYPE_CHOICES = ("auto", "bfloat16", "float16")  # vtools.runtime.amp.AMP_DTYPES
ON_BAD_IMAGE_CHOICES = ("error", "skip")  # vtools.data.decode.ON_BAD_IMAGE
METRICS_AVERAGE_CHOICES = ("micro", "macro", "weighted")  # vtools.evaluation.metrics.METRICS_AVERAGES
LABEL_TYPE_CHOICES = ("none", "name", "description", "detail")  # vtools.models.folder.LABEL_TYPES
CALIBRATION_BINS = 15  # vtools.evaluation.class_report.DEFAULT_BINS

# torch's floating dtypes a model can be cast to and run in (its float8/float4 types hold weights, not run them)
MODEL_DTYPES = ("float32", "float", "float64", "double", "float16", "half", "bfloat16")

# timm's resize names (timm.data.transforms.str_to_interp_mode), and random: one of them per image
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "box", "hamming", "lanczos", "random")


def interpolation_name(name: str) -> str:
    """timm's interpolation names (and random, which picks one per image); empty = the model's."""
    if name not in ("", *INTERPOLATIONS):
        raise argparse.ArgumentTypeError(f"invalid interpolation {name!r}: use one of {', '.join(INTERPOLATIONS)}")
    return name


def model_dtype_name(name: str) -> str:
    """A torch floating dtype's name, as timm's --model-dtype takes it."""
    if name not in MODEL_DTYPES:
        raise argparse.ArgumentTypeError(f"invalid dtype {name!r}: use float32, bfloat16 or float16")
    return name


def recovery_interval(text: str) -> int | str:
    """--recovery-interval: a whole number of updates (timm's meaning), or a duration of training such as
    ``900s``, ``30m`` or ``2h`` for steps too long to count; kept as written, so config.yaml repeats it."""
    value = str(text).strip().lower()
    if value.isdigit():
        return int(value)
    if value[:-1].replace(".", "", 1).isdigit() and value[-1:] in DURATION_UNITS and float(value[:-1]) > 0:
        return value
    raise argparse.ArgumentTypeError(
        f"invalid interval {text!r}: give a number of updates (500) or a time of training (900s, 30m, 2h)"
    )


# --dist-timeout's range: below 10 s a healthy job's start-up and heartbeats (0.5 s apart at least) cannot tell a
# slow rank from a stopped one; past 30 days the timeouts overflow what torch and the collective libraries take
DIST_TIMEOUT_RANGE = (10.0, 30 * 24 * 3600.0)


def collective_seconds(text: str) -> float:
    """A collective timeout in seconds (--dist-timeout), within :data:`DIST_TIMEOUT_RANGE`."""
    low, high = DIST_TIMEOUT_RANGE
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: give seconds from {low:.0f} to {high:.0f} (30 days), e.g. 600"
        )
    return value
