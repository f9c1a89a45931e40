"""timm's preprocessing for a model, with the command line's overrides.

The transforms are timm's own (``resolve_data_config`` + ``create_transform``), so
numbers match timm's scripts; they end in uint8 tensors because normalization
happens on the device (``vtools.data.loaders.DeviceLoader``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from timm.data import create_transform, resolve_data_config

from vtools.errors import UsageError


def data_config_for(model: torch.nn.Module, overrides: dict[str, Any], use_test_size: bool = False) -> dict[str, Any]:
    """timm's data config for ``model`` with command-line overrides (img_size, crop_pct, mean...);
    ``use_test_size`` takes the pretrained config's test_input_size/test_crop_pct where it has them
    (timm's validate.py does, unless --use-train-size)."""
    args = {k: v for k, v in overrides.items() if v is not None}
    config = resolve_data_config(args=args, model=model, use_test_size=use_test_size)
    channels = args["input_size"][0] if "input_size" in args else args.get("in_chans", config["input_size"][0])
    config["input_size"] = (channels, *config["input_size"][1:])
    config["mean"] = _per_channel(config["mean"], channels)
    config["std"] = _per_channel(config["std"], channels)
    unusable = [v for v in (*config["mean"], *config["std"]) if not math.isfinite(v)] or min(
        map(abs, config["std"])
    ) == 0
    if unusable:
        raise UsageError(
            f"the model's preprocessing has mean {list(config['mean'])} and std {list(config['std'])}: "
            "normalization needs finite values and a std that is not 0 (fix its config.json, or pass --mean/--std)"
        )
    check_fixed_size(model, config["input_size"][1:])
    return config


def check_fixed_size(model: torch.nn.Module, size: Sequence[int]) -> None:
    """A model built for one image size only (a ViT's patch embedding with a strict size) refuses any
    other at its first forward, mid-run and as a traceback; say so before any loader starts."""
    for module in model.modules():
        fixed = getattr(module, "img_size", None) if getattr(module, "strict_img_size", False) else None
        if fixed is not None and tuple(fixed) != tuple(size):
            height, width = fixed
            raise UsageError(
                f"the model takes {height}x{width} images only and the data is {size[0]}x{size[1]}: build it for "
                f"that size with --model-kwargs img_size={size[0]} (or dynamic_img_size=True), or drop --img-size"
            )


def _per_channel(values: Sequence[float], channels: int) -> tuple[float, ...]:
    """Normalization constants for ``channels`` inputs (a 3-channel mean averaged for grayscale)."""
    values = tuple(values)
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    return (sum(values) / len(values),) * channels


def eval_transform(data_config: dict[str, Any], crop_border_pixels: int | None = None) -> Callable:
    """timm's evaluation preprocessing, ending in uint8 tensors (normalization is on the device);
    ``crop_border_pixels`` is timm's --crop-border-pixels (pixels cut from each side first)."""
    return create_transform(
        **data_config, is_training=False, use_prefetcher=True, crop_border_pixels=crop_border_pixels
    )


def image_mode(data_config: dict[str, Any], input_img_mode: str | None = None) -> str:
    """The PIL mode images are read in: --input-img-mode, else from the model's input channels."""
    if input_img_mode:
        return input_img_mode
    return "L" if data_config["input_size"][0] == 1 else "RGB"
