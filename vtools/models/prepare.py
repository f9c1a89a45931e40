"""Getting a model ready to run: memory layout, eval mode, parameter counts, unwrapping DDP/compile."""

from __future__ import annotations

import torch

from vtools.errors import UsageError
from vtools.models.onnx_model import OnnxModel
from vtools.runtime.compiler import compile_for


def count_params(model: torch.nn.Module) -> int | None:
    """The model's weights; a model whose weights live outside torch (an ONNX file) gives its own count,
    None where it cannot tell."""
    if hasattr(model, "param_count"):
        return model.param_count
    return sum(p.numel() for p in model.parameters())


def is_convnet(model: torch.nn.Module) -> bool:
    """Several 2-d convolutions: a CNN (a ViT has one, its patch embedding)."""
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) >= 3


def use_channels_last(flag: bool | None, model: torch.nn.Module, device: torch.device) -> bool:
    """--channels-last / --no-channels-last, or (unset) where it is faster: CNNs on devices that like NHWC."""
    from vtools.runtime.device import kind_of

    if flag is not None:
        return flag
    return kind_of(device.type).channels_last and is_convnet(model)


def prepare_for_eval(
    model: torch.nn.Module,
    channels_last: bool = False,
    torchcompile: str | None = None,
    torchcompile_mode: str | None = None,
) -> torch.nn.Module:
    """Eval mode, memory layout and optional torch.compile (backend, mode), in that order."""
    model.eval()
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if torchcompile and isinstance(model, OnnxModel):
        raise UsageError("--torchcompile compiles PyTorch models; an ONNX file runs in onnxruntime")
    if torchcompile:
        device = next(model.parameters(), torch.empty(0)).device
        model = compile_for(device, model, torchcompile, torchcompile_mode)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside torch.compile and DDP wrappers (their state_dict keys carry prefixes)."""
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)
