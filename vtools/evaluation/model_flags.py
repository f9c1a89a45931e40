"""Model flags that timm's validate.py and inference.py share, and getting the model ready with them.

timm's order is kept: create, load weights, --reparam, resolve the data config,
--test-pool, cast to --model-dtype, memory layout, --torchcompile (with
--torchcompile-mode).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from vtools.cli.timm_compat import add_no_op, add_refused
from vtools.errors import UsageError
from vtools.models.prepare import prepare_for_eval

NUM_GPU_REASON = (
    "wraps the model in DataParallel over several GPUs, which is not supported here: one process runs "
    "on one device; choose it with --device (e.g. cuda:1, npu:1)"
)
AOT_AUTOGRAD_REASON = (
    "functorch's memory_efficient_fusion (AOT Autograd) is deprecated in torch 2.x and not supported here; "
    "use --torchcompile"
)
INFER_TRAIN_SIZE_REASON = (
    "timm's inference.py always resolves the model's train input size (never its test size), and so does "
    "inference.py here"
)


def add_eval_model_args(parser: argparse.ArgumentParser, script: str) -> None:
    """--use-train-size, --test-pool, --num-gpu, --aot-autograd (``script``: validate or inference)."""
    group = parser.add_argument_group("timm's evaluation model flags")
    if script == "validate":
        group.add_argument(
            "--use-train-size",
            action="store_true",
            default=False,
            help="use the model's train input size and crop even when its pretrained config has a test size "
            "(default: the test size, as timm's validate.py)",
        )
        group.add_argument(
            "--reparam",
            action="store_true",
            default=False,
            help="fuse re-parameterizable branches (RepVGG, MobileOne, FastViT...) before validating",
        )
    else:
        add_no_op(group, "--use-train-size", action="store_true", default=False, reason=INFER_TRAIN_SIZE_REASON)
    group.add_argument(
        "--test-pool",
        action="store_true",
        default=False,
        help="test-time pooling when the input is larger than the model's pretrained size (crop 1.0 then)",
    )
    add_refused(group, "--num-gpu", type=int, default=1, reason=NUM_GPU_REASON)
    add_refused(group, "--aot-autograd", action="store_true", default=False, reason=AOT_AUTOGRAD_REASON)


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


def ready_for_eval(
    args: argparse.Namespace,
    model: torch.nn.Module,
    data_config: dict[str, Any],
    model_dtype: torch.dtype | None,
    channels_last: bool,
) -> torch.nn.Module:
    """--test-pool (which sets the crop to 1.0 in ``data_config``, as timm's scripts do), --model-dtype,
    memory layout and --torchcompile/--torchcompile-mode. Call before the loader is built from ``data_config``."""
    if args.test_pool:
        from timm.layers import apply_test_time_pool

        device = next(model.parameters()).device
        model, pooled = apply_test_time_pool(model, data_config)
        model = model.to(device)  # the pooling head's new layers are made on the cpu
        if pooled:
            data_config["crop_pct"] = 1.0
            print(f"test-time pooling: input {data_config['input_size'][-2:]} is larger than the pretrained size")
    if model_dtype is not None:
        model = model.to(dtype=model_dtype)
    return prepare_for_eval(model, channels_last, args.torchcompile, args.torchcompile_mode)


def reparameterized(model: torch.nn.Module) -> torch.nn.Module:
    """timm's --reparam: branches fused into single convolutions, through timm's own function."""
    from timm.utils.model import reparameterize_model

    return reparameterize_model(model)
