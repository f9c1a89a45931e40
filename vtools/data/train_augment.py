"""timm's training augmentation with less host work per image.

For timm's usual recipe (RandomResizedCrop, flips, colour jitter) a loader worker draws every random
parameter with timm's and torchvision's own functions, in their order and on their RNGs, so a seed
gives timm's crop box, interpolation, flips and jitter factors. It then does less with them than
timm's transforms do:

- a JPEG is decoded at 1/2, 1/4 or 1/8 scale (the decoder's DCT scaling) when the sampled crop, so
  reduced, still covers the output size in both directions; any other image is decoded in full and
  cropped and resized exactly as timm does, to the same pixels;
- an image already in the model's mode is not converted (a copy), and a grayscale one stays one
  channel until the copy into the batch broadcasts it;
- flips happen in that copy (a reversed view), and colour jitter on the device
  (:mod:`vtools.data.color_jitter`), each image with its drawn parameters; except where the device is
  the host's own cores and the images are large, where PIL's 8-bit jitter in the workers costs less
  (:func:`jitter_on_device`);
- the batch travels channels-last (N x H x W x C uint8), which the device reads as NCHW without a copy.

Any other recipe (auto-augment, blur, grayscale, hue jitter, another crop mode) keeps timm's transform.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation
from torchvision.transforms import ColorJitter, Compose, RandomHorizontalFlip, RandomVerticalFlip
from torchvision.transforms import functional as F

from vtools.data import color_jitter
from vtools.data.decode import BadSample, open_image

REDUCTIONS = (8, 4, 2)  # the scales libjpeg decodes at besides 1, largest first

# On one core, timm's jitter costs per image in PIL / batched in float32 torch: 0.19 / 0.04 ms at 32 px,
# 0.27 / 0.17 at 64 px, 0.31 / 0.69 at 96 px, 0.83 / 2.78 at 224 px (docs/performance.md)
HOST_JITTER_MAX_SIDE = 64


def jitter_on_device(computes_on_host: bool, size: tuple[int, int]) -> bool:
    """Whether the device applies the colour jitter: always on an accelerator (the host does none of
    it); on the host's own cores only for images up to HOST_JITTER_MAX_SIDE, where batching wins."""
    return not computes_on_host or max(size) <= HOST_JITTER_MAX_SIDE


@dataclass
class AugmentedImage:
    """A cropped and resized image (H x W x 1 or C uint8) with what is left to do: flips, done while it
    is copied into the batch, and colour jitter parameters for the device."""

    pixels: np.ndarray
    channels: int
    hflip: bool
    vflip: bool
    jitter: np.ndarray | None


class FusedTrainAugment:
    """timm's RandomResizedCrop + flips + colour jitter, drawn as timm draws them and applied with less
    host work (module docstring). ``reduced_decodes`` counts the images decoded at reduced scale."""

    def __init__(
        self,
        crop: RandomResizedCropAndInterpolation,
        flips: list[RandomHorizontalFlip | RandomVerticalFlip],
        jitter: ColorJitter | None,
        mode: str,
        device_jitter: bool = True,
    ) -> None:
        self.crop = crop
        self.flips = flips
        self.jitter = jitter
        self.mode = mode
        self.device_jitter = device_jitter
        self.channels = len(Image.new(mode, (1, 1)).getbands())
        self.reduced_decodes = 0

    def __call__(self, image: Image.Image) -> AugmentedImage:
        """Augment an image decoded already (kept from an earlier epoch, or from a torchvision set)."""
        return self._finish(self._usable(image), *self._draw(image))

    def decode(self, source: str | os.PathLike | bytes, name: str) -> Image.Image | BadSample:
        """Decode in full for keeping, leaving a grayscale image in one channel."""
        return open_image(source, self.mode, name, gray_as_is=self.mode == "RGB")

    def from_source(self, source: str | os.PathLike | bytes, name: str) -> AugmentedImage | BadSample:
        """Read the image's size, draw the parameters, then decode only as much of it as they need."""
        drawn: list[Any] = []

        def reduce_before_load(image: Image.Image) -> None:
            drawn.extend(self._draw(image))
            reduction = self.reduction(drawn[0]) if image.format == "JPEG" else 1
            if reduction > 1:
                width, height = image.size
                image.draft(image.mode, (math.ceil(width / reduction), math.ceil(height / reduction)))

        image = open_image(source, self.mode, name, gray_as_is=self.mode == "RGB", before_load=reduce_before_load)
        if isinstance(image, BadSample):
            return image
        return self._finish(image, *drawn)

    def reduction(self, box: tuple[int, int, int, int]) -> int:
        """The largest decoder scale-down that leaves the crop at least the output size both ways."""
        _, _, height, width = box
        out_height, out_width = self.crop.size
        for reduction in REDUCTIONS:
            if height >= out_height * reduction and width >= out_width * reduction:
                return reduction
        return 1

    def _draw(self, image: Image.Image) -> tuple[Any, ...]:
        """Every random choice, made by timm's and torchvision's calls in their order."""
        box = self.crop.get_params(image, self.crop.scale, self.crop.ratio)
        interpolation = self.crop.interpolation
        if isinstance(interpolation, (tuple, list)):  # timm's 'random': Python's RNG, as timm
            interpolation = random.choice(interpolation)
        flipped = [bool(torch.rand(1) < flip.p) for flip in self.flips]
        device_jitter = self.jitter is not None and self.device_jitter
        jitter = color_jitter.draw_params(self.jitter) if device_jitter else None
        return box, interpolation, image.size, flipped, jitter

    def _usable(self, image: Image.Image) -> Image.Image:
        if image.mode == self.mode or (image.mode == "L" and self.mode == "RGB"):
            return image
        return image.convert(self.mode)

    def _finish(
        self,
        image: Image.Image,
        box: tuple[int, int, int, int],
        interpolation: F.InterpolationMode,
        full_size: tuple[int, int],
        flipped: list[bool],
        jitter: np.ndarray | None,
    ) -> AugmentedImage:
        top, left, height, width = box
        resample = F.pil_modes_mapping[interpolation]
        if image.size == full_size:  # decoded in full: timm's crop, then resize (torchvision's PIL calls)
            image = image.crop((left, top, left + width, top + height)).resize(self.crop.size[::-1], resample)
        else:  # decoded at reduced scale: the same region of the smaller image
            self.reduced_decodes += 1
            scale_x, scale_y = image.size[0] / full_size[0], image.size[1] / full_size[1]
            region = (left * scale_x, top * scale_y, (left + width) * scale_x, (top + height) * scale_y)
            image = image.resize(self.crop.size[::-1], resample, box=region)
        if self.jitter is not None and not self.device_jitter:  # timm's own, drawn last as in timm
            image = self.jitter(image)
        pixels = np.asarray(image)
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        hflip = any(on for on, flip in zip(flipped, self.flips) if isinstance(flip, RandomHorizontalFlip))
        vflip = any(on for on, flip in zip(flipped, self.flips) if isinstance(flip, RandomVerticalFlip))
        return AugmentedImage(pixels, self.channels, hflip, vflip, jitter)


def fuse(transform: Any, mode: str, computes_on_host: bool = False) -> FusedTrainAugment | None:
    """The fused form of timm's training ``transform`` (built with use_prefetcher=True) when it is the
    usual recipe and images are read as RGB or L; None when it holds anything else. ``computes_on_host``:
    the device is the host's cores (where the jitter goes: :func:`jitter_on_device`)."""
    if mode not in ("RGB", "L") or not isinstance(transform, Compose):
        return None
    steps = list(transform.transforms)
    if not steps or type(steps[0]) is not RandomResizedCropAndInterpolation or type(steps[-1]) is not MaybePILToTensor:
        return None
    middle = steps[1:-1]
    flips = [step for step in middle if type(step) in (RandomHorizontalFlip, RandomVerticalFlip)]
    rest = middle[len(flips) :]
    if middle[: len(flips)] != flips or len(rest) > 1:
        return None
    jitter = rest[0] if rest else None
    if jitter is not None and (type(jitter) is not ColorJitter or not color_jitter.can_apply(jitter)):
        return None
    device_jitter = jitter_on_device(computes_on_host, steps[0].size)
    return FusedTrainAugment(steps[0], flips, jitter, mode, device_jitter)
