"""Decoding one image, and what an unreadable one becomes.

Unreadable images never raise inside a loader worker: they travel to the main process
as :class:`BadSample`, so the error is one clear line naming the file (``--on-bad-image
error``) or a counted skip. Every data source decodes through :func:`open_image`, so
16-bit, float and palette images are handled the same whatever stores them.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, UnidentifiedImageError

from vtools.errors import UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm")


ON_BAD_IMAGE = ("error", "skip")


@dataclass(frozen=True)
class BadSample:
    """An image that could not be read, decoded or transformed, carried to the main process instead of
    an exception.

    ``replaced`` marks one that training swapped for another readable image, so
    that batches keep the size the recipe assumes. ``step`` names what failed (reading, decoding, or
    ``transform <name>``), ``where`` the place in the run (epoch, batch) once known.
    """

    path: str
    reason: str
    replaced: bool = False
    step: str = "reading"
    where: str = ""

    @property
    def transform_failed(self) -> bool:
        return self.step.startswith("transform")

    def describe(self) -> str:
        """What failed and where: ``decoding failed (OSError: ...) at epoch 0, batch 3``."""
        return f"{self.step} failed ({self.reason})" + (f" at {self.where}" if self.where else "")


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
        return BadSample(name or str(source), _reason(err, source), step=_step(err))


def _step(err: Exception) -> str:
    """Opening the file (it is missing, a folder, not ours to read) is reading; the rest is decoding."""
    return "reading" if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)) else "decoding"


def _reason(err: Exception, source: str | os.PathLike | bytes) -> str:
    if isinstance(err, FileNotFoundError) and not isinstance(source, bytes) and os.path.islink(source):
        return not_a_file_reason(source)  # a dangling link: say where it points
    return f"{type(err).__name__}: {err}".splitlines()[0]


def not_a_file_reason(path: str | os.PathLike) -> str:
    """Why an entry named like an image is not a regular file one can read (a dangling link, a FIFO
    that would block its reader, a device). Only called for such entries: it stats them again."""
    what = f"a link to {os.readlink(path)}, which" if os.path.islink(path) else "it"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{what} does not exist"
    except OSError as err:
        return f"{what} cannot be followed ({type(err).__name__}: {err.strerror})"
    kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
    return f"{what} is {kind}"


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
    unlabelled; a multi-label sample's multi-hot row, see vtools.data.label_sets), and the name that
    messages and results use for it."""

    image: str | bytes
    label: int | np.ndarray
    name: str


def bad_image_handler(
    policy: str, skipped: list[str], keep_batches_full: bool = False, during: str = ""
) -> Callable[[list[BadSample]], None]:
    """--on-bad-image: stop naming the file, the step that failed and where (error), or warn once per
    file and record it in ``skipped`` (skip). With ``keep_batches_full`` (training), a bad image that
    nothing could replace stops the run instead: a shorter or empty batch must never reach the model.
    ``during`` names the pass in messages (``training``, ``validation``)."""
    if policy not in ON_BAD_IMAGE:
        raise UsageError(f"--on-bad-image {policy!r}: choose error or skip")
    seen: set[str] = set()

    def handle(samples: list[BadSample]) -> None:
        for sample in samples:
            if during:
                sample = replace(sample, where=f"{during} {sample.where}".strip())
            if policy == "error":
                raise UsageError(refusal(sample))
            if keep_batches_full and not sample.replaced:
                raise UsageError(
                    f"{_cannot(sample)} {sample.path}: {sample.describe()}, and no readable training "
                    "image is left to take its place"
                )
            if sample.path in seen:
                continue
            seen.add(sample.path)
            instead = "; training uses another image in its place" if sample.replaced else ""
            what = "image" if sample.transform_failed else "unreadable image"
            print(f"warning: skipped {what} {sample.path}: {sample.describe()}{instead}", file=sys.stderr)
            skipped.append(sample.path)

    return handle


def refusal(sample: BadSample, more: int = 0) -> str:
    """The one line that stops a run on ``sample`` under --on-bad-image error: the image, the step that
    failed and where, and what to do (``more``: how many other entries are known to be unreadable)."""
    if sample.transform_failed:
        advice = "check that image and the transform's options, or use --on-bad-image skip to skip images that fail"
    else:
        advice = "use --on-bad-image skip to skip unreadable images"
    others = f" ({more} more cannot be read either)" if more else ""
    return f"{_cannot(sample)} {sample.path}: {sample.describe()}{others}; {advice}"


def _cannot(sample: BadSample) -> str:
    return "cannot transform image" if sample.transform_failed else "cannot read image"
