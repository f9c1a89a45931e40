"""timm's colour jitter applied to a whole batch on the device, each image with its own factors and order.

In timm's training transform every loader worker runs torchvision's ``ColorJitter`` on each PIL image:
three blends, which on small images cost more than decoding them. Here the worker only draws the
parameters (torchvision's own ``ColorJitter.get_params``, so their distribution is timm's) and the
device applies them to the batch with PIL's arithmetic: each step blends with the step's degenerate
image in float32 and truncates to 8 bits, as PIL's ``ImageEnhance`` and ``Image.blend`` do, so the
result equals timm's pixels.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch
from torchvision.transforms import ColorJitter

from vtools.runtime.device import pin_memory

BRIGHTNESS, CONTRAST, SATURATION, HUE = range(4)
PARAM_COUNT = 7  # the order of the four steps, then the brightness, contrast and saturation factors


def can_apply(jitter: ColorJitter) -> bool:
    """Hue is not reproduced here (PIL shifts it in HSV): a jitter with hue stays in the workers."""
    return jitter.hue is None


def draw_params(jitter: ColorJitter) -> np.ndarray:
    """One image's parameters, drawn by the same calls on the same RNG as ``ColorJitter.forward``; a step
    without a range gets NaN."""
    order, brightness, contrast, saturation, _ = ColorJitter.get_params(
        jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue
    )
    factors = [math.nan if f is None else f for f in (brightness, contrast, saturation)]
    return np.array([*order.tolist(), *factors], dtype=np.float32)


def _gray(images: torch.Tensor) -> torch.Tensor:
    """PIL's RGB to L conversion (ITU-R 601-2 in 16-bit fixed point, rounded), exact in float32: every
    partial sum stays below 2**24."""
    if images.shape[1] == 1:
        return images
    red, green, blue = images[:, 0:1], images[:, 1:2], images[:, 2:3]
    return torch.floor((red * 19595 + green * 38470 + blue * 7471 + 32768) / 65536)


def _blend(degenerate: torch.Tensor, images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ``Image.blend``: degenerate + factor * (image - degenerate) in float32, clipped, truncated."""
    return torch.floor((degenerate + factor * (images - degenerate)).clamp_(0, 255))


def _brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(torch.zeros_like(images), images, factor)


def _contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """The degenerate image is the mean of the L image, rounded to an integer (``ImageEnhance.Contrast``);
    computed in integers so that large images round as PIL does."""
    total = _gray(images).to(torch.int64).sum(dim=(1, 2, 3), keepdim=True)
    pixels = images.shape[2] * images.shape[3]
    mean = torch.div(2 * total + pixels, 2 * pixels, rounding_mode="floor").to(images.dtype)
    return _blend(mean.expand_as(images), images, factor)


def _saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(_gray(images).expand_as(images), images, factor)


_STEPS = {BRIGHTNESS: _brightness, CONTRAST: _contrast, SATURATION: _saturation}


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``, copied asynchronously only from pinned memory: an asynchronous copy from
    pageable memory may read it after Python has freed it (a backend need not copy it first), and where the
    device pins its batches a small temporary is pinned for the copy."""
    if device.type != "cpu" and pin_memory(device) and not host.is_pinned():
        host = host.pin_memory()
    return host.to(device, non_blocking=host.is_pinned())


def apply(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Jitter ``images`` (float, N x C x H x W, integer values 0..255) with each image's ``params`` (a host
    tensor, N x PARAM_COUNT). Images are grouped by the order of their steps, read on the host, so the
    device never synchronises with it."""
    table = params.numpy()
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for row, values in enumerate(table):
        order = tuple(int(step) for step in values[:4] if step != HUE and not math.isnan(values[4 + int(step)]))
        groups[order].append(row)
    factors = _to_device(params[:, 4:], images.device).view(-1, 3, 1, 1, 1)
    for order, rows in groups.items():
        if not order:
            continue
        whole = len(rows) == len(table)
        index = None if whole else _to_device(torch.tensor(rows), images.device)
        part = images if whole else images.index_select(0, index)
        part_factors = factors if whole else factors.index_select(0, index)
        for step in order:
            part = _STEPS[step](part, part_factors[:, step])
        images = part if whole else images.index_copy(0, index, part)
    return images
