"""``torch.npu.utils`` for the emulated Ascend NPU: the float-status half of torch_npu's ``npu/utils.py``.

Where the chip saturates (no Inf/NaN mode, chips.py), an overflow leaves no inf to find: these functions read
and lower the chip's float-status flag through the ``npu::`` status operators (npu_overflow.cpp). On an Inf/NaN
chip they behave as the wheel's do there: the flag functions refuse or warn, and ``npu_check_overflow`` looks
at the values. Names, parameters and messages are the wheel's (tests/runtime/test_device_kinds_wheel.py).
"""

from __future__ import annotations

import math
import warnings

import torch

from . import chips
from ._build import load_extension

_NOT_SUPPORT = (7, "feature not supported")


def _pta_error(code: tuple[int, str]) -> str:
    from .device import _pta_error

    return _pta_error(code)


def is_support_inf_nan() -> bool:
    """False where the chip saturates instead of producing inf and NaN (an Atlas training chip)."""
    return not load_extension().saturates()


def is_force_overflow_check() -> bool:
    """FORCE_OVERFLOW_CHECK=1 on CANN 9.1.0 or later: the flag is kept in Inf/NaN mode too."""
    return chips.force_overflow_check()


def _flag_checks() -> bool:
    return not is_support_inf_nan() or is_force_overflow_check()


def get_npu_overflow_flag() -> bool:
    """Whether the current device's float-status flag is raised (a host read: it waits for the device)."""
    if not _flag_checks():
        raise RuntimeError(
            "Unsupported api when soc_version >= Ascend910B1, please use npu_check_overflow" + _pta_error(_NOT_SUPPORT)
        )
    status = torch.ops.npu.npu_get_float_status(torch.zeros(8).npu())
    return bool(status.cpu()[0] != 0)


def npu_check_overflow(grad: float | torch.Tensor) -> bool:
    """Whether ``grad`` overflowed: its sum on an Inf/NaN chip, the float-status flag (then lowered) elsewhere."""
    if not _flag_checks():
        if isinstance(grad, float):
            total = grad
        elif isinstance(grad, torch.Tensor):
            total = float(grad.float().sum())
        else:
            raise RuntimeError("Unsupported type." + _pta_error((2, "invalid type")))
        return not math.isfinite(total)
    raised = get_npu_overflow_flag()
    if raised:
        clear_npu_overflow_flag()
    return raised


def clear_npu_overflow_flag() -> None:
    """Lower the current device's float-status flag (useless, and said so, on an Inf/NaN chip)."""
    if not _flag_checks():
        warnings.warn(
            "When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless. Please remove it.", stacklevel=2
        )
        return
    torch.ops.npu.npu_clear_float_status(torch.zeros(8).npu())
