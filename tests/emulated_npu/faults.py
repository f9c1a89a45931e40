"""An opt-in numeric fault: one operator's npu results come out slightly wrong.

``VTOOLS_EMU_NPU_FAULT_OP=aten::addmm`` multiplies every floating-point result
of that operator on the emulated npu by ``1 + VTOOLS_EMU_NPU_FAULT_SCALE``
(default 1e-2, i.e. +1 % relative), the kind of error a faulty NPU kernel
makes. It exists for parity checks (same inputs on cpu and npu, compare):
such a check must find the operator; without the variable nothing changes.
The operator is named as in :mod:`.fallbacks` (``aten::add.Tensor``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from . import fallbacks

FAULT_ENV = "VTOOLS_EMU_NPU_FAULT_OP"
SCALE_ENV = "VTOOLS_EMU_NPU_FAULT_SCALE"
DEFAULT_SCALE = 1e-2


def _scale(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_SCALE
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a number (a relative error, e.g. 0.01), got {text!r}") from None


@contextmanager
def faulty(op: str, scale: float = DEFAULT_SCALE) -> Iterator[None]:
    """In-process tests: ``op``'s npu results are off by ``scale`` inside the block."""
    fallbacks.hook(op, fault_scale=scale)
    try:
        yield
    finally:
        fallbacks.drop_fault(op)


def install_from_env() -> None:
    """Apply VTOOLS_EMU_NPU_FAULT_OP / VTOOLS_EMU_NPU_FAULT_SCALE (a bad value raises ValueError)."""
    op = os.environ.get(FAULT_ENV, "").strip()
    if not op:
        return
    scale = _scale(os.environ.get(SCALE_ENV))
    try:
        fallbacks.hook(op, fault_scale=scale)
    except ValueError as err:
        raise ValueError(f"{FAULT_ENV}: {err}") from None
