"""Getting a model ready with the evaluation model flags that timm's validate.py and inference.py share
(declared in vtools/cli/eval_flags.py).

timm's order is kept: create, load weights, --reparam, resolve the data config,
--test-pool, cast to --model-dtype, memory layout, --torchcompile (with
--torchcompile-mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.models.prepare import prepare_for_eval


def check_input_mode(mode: str, data_config: dict[str, Any]) -> None:
    """--input-img-mode must give the channels the model takes."""
    from PIL import Image

    try:
        bands = Image.getmodebands(mode)
    except (KeyError, ValueError):
        raise UsageError(f"--input-img-mode {mode}: not a PIL image mode (RGB, L, RGBA, ...)") from None
    channels = data_config["input_size"][0]
    if bands != channels:
        raise UsageError(
            f"images are read in PIL mode {mode} ({bands} channels) but the model takes {channels}: pass "
            f"--input-img-mode with a {channels}-band mode (L, LA, RGB, RGBA...) or --in-chans {bands}"
        )


@dataclass(frozen=True)
class ReadyOptions:
    """The flags that change a created model before evaluation (field names are the flags' dests)."""

    test_pool: bool  # --test-pool: timm's test-time pooling on inputs larger than the pretrained size
    torchcompile: str | None  # --torchcompile BACKEND
    torchcompile_mode: str | None


def ready_for_eval(
    options: ReadyOptions,
    model: torch.nn.Module,
    data_config: dict[str, Any],
    model_dtype: torch.dtype | None,
    channels_last: bool,
) -> torch.nn.Module:
    """--test-pool (which sets the crop to 1.0 in ``data_config``, as timm's scripts do), --model-dtype,
    memory layout and --torchcompile/--torchcompile-mode. Call before the loader is built from ``data_config``."""
    if options.test_pool:
        from timm.layers import apply_test_time_pool

        device = next(model.parameters()).device
        model, pooled = apply_test_time_pool(model, data_config)
        model = model.to(device)  # the pooling head's new layers are made on the cpu
        if pooled:
            data_config["crop_pct"] = 1.0
            print(f"test-time pooling: input {data_config['input_size'][-2:]} is larger than the pretrained size")
    if model_dtype is not None:
        model = model.to(dtype=model_dtype)
    return prepare_for_eval(model, channels_last, options.torchcompile, options.torchcompile_mode)


def reparameterized(model: torch.nn.Module) -> torch.nn.Module:
    """timm's --reparam: branches fused into single convolutions, through timm's own function."""
    from timm.utils.model import reparameterize_model

    return reparameterize_model(model)
