"""An opt-in slow kernel that runs asynchronously, as a real NPU's kernels do.

The emulator's kernels finish before they return, so code that times a step without waiting for the
device measures the same as code that waits, and a missing synchronize cannot show. With
``VTOOLS_EMU_NPU_SLOW_OP=aten::addmm`` (operators named as in :mod:`.fallbacks`, comma-separated) each
call of that operator still returns at once but keeps the device busy for ``VTOOLS_EMU_NPU_SLOW_MS``
milliseconds more (default 20), queued after whatever it was already busy with. ``torch.npu.synchronize``
and ``.item()`` wait until the device is idle, as on an NPU, so a timer that synchronizes includes the slow
kernels and one that does not, does not. Unlike an NPU, a copy to the cpu does not wait (see HOST_READS).
"""

from __future__ import annotations

import os
import threading
import time

SLOW_ENV = "VTOOLS_EMU_NPU_SLOW_OP"
MS_ENV = "VTOOLS_EMU_NPU_SLOW_MS"
DEFAULT_MS = 20.0
# .item(): a host read that waits for the device. Copies out of the device (.cpu()) do not wait here: the
# emulator's own kernels copy their inputs to the host through the same operators, mid-queue
HOST_READS = ("aten::_local_scalar_dense",)

_lock = threading.Lock()
_busy_until = 0.0  # time.monotonic() at which the device has run every kernel queued so far


def occupy(milliseconds: float) -> None:
    """Queue ``milliseconds`` of device work after what is queued, without waiting for it."""
    global _busy_until
    with _lock:
        _busy_until = max(_busy_until, time.monotonic()) + milliseconds / 1000


def wait_idle() -> None:
    """Block until every queued kernel has run (what synchronizing the device does)."""
    with _lock:
        left = _busy_until - time.monotonic()
    if left > 0:
        time.sleep(left)


def _milliseconds(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_MS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{MS_ENV} must be a positive number of milliseconds, got {text!r}")
    return value


def install_from_env() -> None:
    """Apply VTOOLS_EMU_NPU_SLOW_OP / VTOOLS_EMU_NPU_SLOW_MS (a bad value raises ValueError)."""
    from . import fallbacks  # which imports this module: its kernels queue and wait through it

    ops = fallbacks.parse_op_list(os.environ.get(SLOW_ENV))
    if not ops:
        return
    milliseconds = _milliseconds(os.environ.get(MS_ENV))
    for op in ops:
        try:
            fallbacks.hook(op, device_ms=milliseconds)
        except ValueError as err:
            raise ValueError(f"{SLOW_ENV}: {err}") from None
    for op in HOST_READS:
        fallbacks.hook(op, waits_for_device=True)
