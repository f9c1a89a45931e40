"""What groups of option values amount to, for the checks in vtools/cli/ and for the library alike.

A rule about options that both the command line's checks and the code that acts on the options need (when
batches are mixed, which channels a model is built with, what an interval of time means) is written here
once; cli/ imports it to refuse what the rule forbids, the library to act on it, and neither imports the
other. ``options`` below: a command's typed options, or a concern with the flags' names.
"""

from __future__ import annotations

from typing import Any

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def mixup_requested(options: Any) -> bool:
    """Whether --mixup, --cutmix or --cutmix-minmax asks for mixed batches (train.py then needs an even
    --batch-size: mixing pairs the images of a batch)."""
    return options.mixup > 0 or options.cutmix > 0 or options.cutmix_minmax is not None


def timm_model_kwargs(options: Any) -> dict[str, Any]:
    """--model-kwargs with the model flags timm passes to create_model alongside them (--gp)."""
    extra = {"global_pool": options.gp} if getattr(options, "gp", None) else {}
    return {**options.model_kwargs, **extra}


def model_in_chans(options: Any) -> int | None:
    """The input channels to build the model with, chosen as timm's scripts choose them: --in-chans, else
    --input-size's first value (--input-size 1 224 224 builds a grayscale model; timm adapts pretrained first
    convolutions to it), else None: the model's own."""
    input_size = getattr(options, "input_size", None)
    return getattr(options, "in_chans", None) or (input_size[0] if input_size else None)


def preprocess_overrides(options: Any) -> dict:
    """The preprocessing flags in the form timm's resolve_data_config reads."""
    return {
        key: getattr(options, key, None)
        for key in ("img_size", "input_size", "in_chans", "crop_pct", "crop_mode", "mean", "std", "interpolation")
    }


def interval_seconds(value: int | str) -> float | None:
    """The seconds a time-form --recovery-interval stands for; None for a count of updates."""
    if isinstance(value, int):
        return None
    return float(value[:-1]) * DURATION_UNITS[value[-1]]
