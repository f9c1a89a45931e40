"""Overflow on a chip that saturates: the float-status flag, where ``isfinite`` has nothing to find.

An IEEE chip turns a float16 result past 65504 into inf, and vtools' overflow checks (the loss stop, the
evaluation's, parity's, the GradScaler's) find it with ``isfinite``. A chip without an Inf/NaN mode (an Ascend
910A) saturates instead: inf becomes the dtype's largest value and NaN becomes 0, so a diverged float16 run
trains on finite garbage; the overflow shows only in the chip's float-status flag, which stays raised until it
is cleared. Whether a device works that way is asked of its backend, through the functions its row names
(:class:`vtools.runtime.device_kinds.FloatStatus`), never decided from a chip's name; on every other device
this module does nothing.

The flag is read and cleared by device operators: a read is a device tensor, so a training step that records
it waits for nothing (the loop looks at its window of readings once per log step, as it looks at the losses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vtools.runtime import device as dev


@dataclass(frozen=True)
class OverflowMode:
    """How a device's overflow can be seen."""

    saturates: bool = False  # no Inf/NaN mode: inf and NaN become finite values
    flag: bool = False  # overflow checks read the float-status flag (a saturating chip, or the backend asked to)

    def describe(self) -> str:
        """For the start lines: how this device's overflow is detected, and why."""
        if self.saturates:
            return (
                "overflow detected through the chip's float-status flag (it saturates: float16 inf reads 65504, "
                "NaN reads 0)"
            )
        if self.flag:
            return "overflow detected through the chip's float-status flag as well (the backend keeps it)"
        return "overflow gives inf/NaN (IEEE)"


IEEE = OverflowMode()


def _function(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _operator(dotted: str) -> Any:
    namespace, name = dotted.split(".")
    return getattr(getattr(torch.ops, namespace), name)


def overflow_mode(device: torch.device) -> OverflowMode:
    """Ask the device's backend whether its chip saturates and whether the flag is kept (IEEE where its row
    names no float status)."""
    status = dev.kind_of(device.type).float_status
    module = dev.device_module(device)
    if status is None or module is None:
        return IEEE
    saturates = not bool(_function(module, status.inf_nan_mode)())
    return OverflowMode(saturates=saturates, flag=saturates or bool(_function(module, status.forced_check)()))


class FloatStatusFlag:
    """A device's float-status flag, read and cleared by device operators (no host synchronisation)."""

    def __init__(self, device: torch.device) -> None:
        status = dev.kind_of(device.type).float_status
        if status is None:
            raise ValueError(f"{device.type} keeps no float-status flag")
        self.device = device
        self._read, self._clear = _operator(status.read_op), _operator(status.clear_op)
        self._buffer = torch.zeros(status.status_size, dtype=torch.float32, device=device)

    def clear(self) -> None:
        self._clear(self._buffer)

    def raised(self) -> torch.Tensor:
        """A 0-dim bool on the device: whether the flag is up now (it stays up)."""
        return self._read(self._buffer)[0] != 0


def float_status_flag(device: torch.device, mode: OverflowMode) -> FloatStatusFlag | None:
    """The flag where ``mode`` says overflow checks must read it, else None."""
    return FloatStatusFlag(device) if mode.flag else None
