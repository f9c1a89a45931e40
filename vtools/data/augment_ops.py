"""timm's auto-augment ops, made to do on every supported Pillow and on grayscale images what the published
recipes did.

timm's RandAugment, AutoAugment and AugMix take each op's function from ``timm.data.auto_augment.NAME_TO_OP``
when they are built. Two edges of that table break runs:

- Posterize keeping 0 bits, which PosterizeIncreasing draws at magnitude 10 and Posterize below 2.5: the DeiT
  recipe ``rand-m9-mstd0.5-inc1`` through its magnitude noise, about 1 image in 660; AutoAugment ``v0`` in one
  sub-policy, about 1 image in 30. Up to Pillow 12 that gave a black image, and the recipes were tuned with it;
  Pillow 13 raises ValueError and the epoch dies.
  Here fewer than 1 bit gives Pillow 12's result (its mask through ``Image.point``, all zeros); 1 to 8 bits
  stay timm's and Pillow's own call.
- The geometric ops (Rotate, ShearX/Y, TranslateX/Y, TranslateX/YRel) fill uncovered pixels with the mean
  colour, a 3-tuple by default, which Pillow refuses for a one-band (L) image. Here the fill is matched to the
  image's bands: the average of the mean for one band (the grey mean vtools normalizes grayscale input with),
  a one-value mean repeated for a colour image (Pillow would fill the red band alone).

:func:`register` puts wrapped functions into timm's table, once; every function that builds a training
transform calls it first. Importing this module changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PIL import Image
from timm.data import auto_augment


class FillMatched:
    """A timm op function called with its fill colour matched to the image's bands. A class, not a closure,
    so a transform holding it pickles (for loader workers that are spawned, not forked)."""

    def __init__(self, timm_op: Callable[..., Image.Image]) -> None:
        self.timm_op = timm_op

    def __call__(self, image: Image.Image, *level: Any, **kwargs: Any) -> Image.Image:
        if "fillcolor" in kwargs:
            kwargs["fillcolor"] = matched_fill(kwargs["fillcolor"], len(image.getbands()))
        return self.timm_op(image, *level, **kwargs)


class PosterizeAnyBits(FillMatched):
    """timm's posterize, with Pillow 12's answer where Pillow 13 refuses: fewer than 1 bit kept."""

    def __call__(self, image: Image.Image, bits: int, **kwargs: Any) -> Image.Image:
        if bits < 1 and image.mode in ("L", "RGB"):
            return pillow12_posterize(image, bits)
        return super().__call__(image, bits, **kwargs)


def pillow12_posterize(image: Image.Image, bits: int) -> Image.Image:
    """``ImageOps.posterize`` as Pillow 12.3 wrote it, for an L or RGB image: keep the top ``bits`` bits of each
    band; for ``bits`` <= 0 the mask keeps none, a black image."""
    mask = ~(2 ** (8 - bits) - 1)
    return image.point([level & mask for level in range(256)] * len(image.getbands()))


def matched_fill(fill: Any, bands: int) -> Any:
    """``fill`` (timm's img_mean) for an image of ``bands`` bands: the mean's average for one band, a single
    value repeated for several; anything else as it is, for Pillow to judge."""
    if not isinstance(fill, (tuple, list)) or len(fill) == bands or not fill:
        return fill
    if bands == 1:
        return (round(sum(fill) / len(fill)),)
    if len(fill) == 1:
        return tuple(fill) * bands
    return fill


def register() -> None:
    """Wrap every op in timm's table (a new timm op gets the matched fill too); idempotent. Call it before
    building a transform: an AugmentOp keeps the function it found when it was made."""
    table = auto_augment.NAME_TO_OP
    for name, op in table.items():
        if not isinstance(op, FillMatched):
            table[name] = (PosterizeAnyBits if op is auto_augment.posterize else FillMatched)(op)
