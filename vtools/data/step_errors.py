"""An exception raised while one sample was loaded, as a :class:`~vtools.data.decode.BadSample` naming the
step that raised.

Inside a loader worker an exception would reach the main process as torch's wrapped traceback; turned
into a bad sample it travels like an unreadable image, and --on-bad-image decides: one line naming the
image and the step, or a counted skip. The step is read off the exception's traceback: the transform
whose ``__call__``/``forward`` raised (with an augmentation op's ``name``, as RandAugment's ops have
one), else decoding or reading by the function that raised.
"""

from __future__ import annotations

import traceback
from typing import Any

from vtools.data.decode import BadSample

TRANSFORM_METHODS = ("__call__", "forward")


def bad_sample_from(err: Exception, name: str) -> BadSample:
    """``err``, raised while sample ``name`` was read, decoded or transformed, as a bad sample."""
    reason = f"{type(err).__name__}: {err}".splitlines()[0].rstrip(": ")
    return BadSample(name, reason, step=failed_step(err))


def failed_step(err: BaseException) -> str:
    """``transform <class>`` (``op <name>`` added for an augmentation op), ``decoding`` or ``reading``."""
    frames = [frame for frame, _ in traceback.walk_tb(err.__traceback__)]
    steps = [_transform_of(frame) for frame in frames if frame.f_code.co_name in TRANSFORM_METHODS]
    steps = [step for step in steps if step is not None]
    if steps:
        ops = [op for op in (getattr(step, "name", None) for step in steps[1:]) if isinstance(op, str)]
        return f"transform {type(steps[0]).__name__}" + (f" op {ops[0]}" if ops else "")
    names = {frame.f_code.co_name for frame in frames}
    return "reading" if "locate" in names and "open_image" not in names else "decoding"


def _transform_of(frame: Any) -> object | None:
    """The transform a ``__call__``/``forward`` frame belongs to; None for a container of transforms
    (timm's and torchvision's Compose), whose failing member is named instead."""
    owner = frame.f_locals.get("self")
    if owner is None or isinstance(getattr(owner, "transforms", None), (list, tuple)):
        return None
    return owner
