"""Decoding one image, and what an unreadable one becomes.

Unreadable images never raise inside a loader worker: they travel to the main process
as :class:`BadSample`, so the error is one clear line naming the file (``--on-bad-image
error``) or a counted skip. Every data source decodes through :func:`open_image`, so
16-bit, float and palette images are handled the same whatever stores them.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from vtools.errors import UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm")


ON_BAD_IMAGE = ("error", "skip")


@dataclass(frozen=True)
class BadSample:
    """An image that could not be decoded, carried to the main process instead of an exception.

    ``replaced`` marks one that training swapped for another readable image, so
    that batches keep the size the recipe assumes.
    """

    path: str
    reason: str
    replaced: bool = False


def open_image(
    source: str | os.PathLike | bytes,
    mode: str,
    name: str | None = None,
    gray_as_is: bool = False,
    before_load: Callable[[Image.Image], None] | None = None,
) -> Image.Image | BadSample:
    """Decode an image (a file, or the bytes of one read from a shard or a table) fully, so truncation
    is caught here, or describe why not. A decompression bomb (more pixels than PIL's limit) is a bad
    image, and so is a float image, which has no 8-bit meaning; 16-bit images are scaled to 8 bits
    rather than clipped. An image already in ``mode`` is not copied; with ``gray_as_is`` a grayscale one
    stays one channel (the caller broadcasts it). ``before_load`` sees the opened image before its pixels
    are decoded (its size and format are known then: a caller may ask for a reduced-scale decode)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
                if before_load is not None:
                    before_load(img)
                img.load()
                img = _to_8_bit(img)
                return img if img.mode == mode or (gray_as_is and img.mode == "L") else img.convert(mode)
    except (
        OSError,
        UnidentifiedImageError,
        ValueError,
        SyntaxError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as err:
        return BadSample(name or str(source), f"{type(err).__name__}: {err}".splitlines()[0])


def _to_8_bit(img: Image.Image) -> Image.Image:
    """PIL's convert() clips 16-bit values at 255; scale them instead. Float images are refused."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") else max(float(values.max()), 1.0)
        return Image.fromarray(np.round(values * (255.0 / top)).clip(0, 255).astype(np.uint8), mode="L")
    if img.mode == "F":
        raise ValueError(
            f"{img.mode}-mode (floating-point) images have no 8-bit meaning; convert them to 8 or 16 bits first"
        )
    return img


@dataclass(frozen=True)
class RawSample:
    """One stored sample before decoding: a file path or the image's bytes, its label (-1 when
    unlabelled), and the name that messages and results use for it."""

    image: str | bytes
    label: int
    name: str


def bad_image_handler(
    policy: str, skipped: list[str], keep_batches_full: bool = False
) -> Callable[[list[BadSample]], None]:
    """--on-bad-image: stop naming the file (error), or warn once per file and record it in ``skipped``
    (skip). With ``keep_batches_full`` (training), a bad image that nothing could replace stops the run
    instead: a shorter or empty batch must never reach the model."""
    if policy not in ON_BAD_IMAGE:
        raise UsageError(f"--on-bad-image {policy!r}: choose error or skip")
    seen: set[str] = set()

    def handle(samples: list[BadSample]) -> None:
        for sample in samples:
            if policy == "error":
                raise UsageError(
                    f"cannot read image {sample.path} ({sample.reason}); "
                    "use --on-bad-image skip to skip unreadable images"
                )
            if keep_batches_full and not sample.replaced:
                raise UsageError(
                    f"cannot read image {sample.path} ({sample.reason}), and no readable training "
                    "image is left to take its place"
                )
            if sample.path in seen:
                continue
            seen.add(sample.path)
            instead = "; training uses another image in its place" if sample.replaced else ""
            print(f"warning: skipped unreadable image {sample.path} ({sample.reason}){instead}", file=sys.stderr)
            skipped.append(sample.path)

    return handle
