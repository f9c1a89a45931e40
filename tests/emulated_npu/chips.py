"""Which Ascend chip the emulator poses as, and how that chip behaves: from vtools' own chip table.

``VTOOLS_EMU_NPU_CHIP`` names the chip by its family's key (``910A``, ``910B``, ``910_93``, ``950``; also
``910B1``..``910B4``); ``get_device_name`` reports the SoC name torch_npu would. What the chip does differently
comes from the family's cells in vtools/runtime/device_chips.py, each with its source there, so the emulator
and vtools cannot disagree about a chip: bfloat16 (none on a 910A), the default ``jit_compile``, and overflow:

- an Atlas training chip (910A) has only the saturation mode: a result that would be +-inf is the dtype's
  largest value, NaN is 0, and overflow shows only in the chip's float-status flag (npu_overflow.cpp keeps it);
- Atlas A2/A3 chips run in Inf/NaN mode and saturate only when asked to, with ``INF_NAN_MODE_ENABLE=0`` and
  ``INF_NAN_MODE_FORCE_DISABLE=1`` (the first alone is refused with the wheel's warning); Ascend950 runs in
  Inf/NaN mode only;
- ``FORCE_OVERFLOW_CHECK=1`` keeps the flag on an Inf/NaN chip as well, from CANN 9.1.0 on (torch_npu's
  ``is_force_overflow_check``); the emulated CANN is ``VTOOLS_EMU_NPU_CANN_VERSION`` (default 9.1.0).

With no chip named the emulator is a generic one ("Emulated Ascend NPU"): Inf/NaN, bfloat16, jit_compile on.
The mode is set when the emulator is installed, as the real runtime sets it when it starts; :func:`posing_as`
switches chips inside one process, for tests that run one body on several.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from vtools.runtime.device_chips import CHIP_FAMILIES, IEEE_ONLY, SATURATES, ChipFamily, family_by_key, family_of

from ._build import load_extension

# VTOOLS_EMU_NPU_CHIP -> what torch_npu's get_device_name reports (the SoC name from aclrtGetSocName)
CHIPS = {
    **{family.key: family.socs[0] for family in CHIP_FAMILIES},
    **{f"910B{n}": f"Ascend910B{n}" for n in range(1, 5)},
}
DEFAULT_CANN = "9.1.0"
FORCE_CHECK_CANN = (9, 1, 0)  # the release from which FORCE_OVERFLOW_CHECK takes effect
# the wheel's words (libtorch_npu.so)
REFUSED_DISABLE = (
    "INF_NAN_MODE_ENABLE shouldn't be set to 0 on the current device. If you want to disable inf-nan mode, "
    "please export INF_NAN_MODE_FORCE_DISABLE=1"
)
OLD_CANN_FORCE = (
    "[PTA]:FORCE_OVERFLOW_CHECK=1 requires CANN >= 9.1.0, current CANN version is {version}. The env var will be "
    "ignored and overflow switch will NOT be enabled in inf-nan mode."
)


def chip() -> str | None:
    """VTOOLS_EMU_NPU_CHIP, None when unset; a value not in :data:`CHIPS` raises ValueError."""
    value = os.environ.get("VTOOLS_EMU_NPU_CHIP", "").strip()
    if value and value not in CHIPS:
        raise ValueError(f"VTOOLS_EMU_NPU_CHIP must be one of {', '.join(CHIPS)}, got {value!r}")
    return value or None


def family() -> ChipFamily | None:
    """The chip table's family of the emulated chip; None for the generic emulator."""
    name = chip()
    return family_of(CHIPS[name]) if name else None


def bf16_supported() -> bool:
    found = family()
    return found is None or bool(found.bf16.value)


def jit_compile_default() -> bool:
    found = family()
    return found is None or bool(found.jit_compile.value)


def internal_format_default() -> bool:
    found = family()
    return found is None or bool(found.internal_format.value)


def fused_on_device(kernel: str) -> bool:
    """Whether fused step ``kernel`` (``_fused_adam_``) has a device kernel on this chip; the generic emulator
    is as conservative as the chips below Ascend950."""
    found = family()
    return kernel in (found.fused_steps.value if found else family_by_key("910B").fused_steps.value)


def _switch(name: str) -> bool:
    """A 0/1 variable of the runtime's, False when unset."""
    value = os.environ.get(name, "0").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{name} should be 0 or 1.")
    return value == "1"


def inf_nan_mode() -> bool:
    """Whether overflow gives inf and NaN (Inf/NaN mode) rather than saturated values."""
    enable = _switch("INF_NAN_MODE_ENABLE") if "INF_NAN_MODE_ENABLE" in os.environ else True
    force_disable = _switch("INF_NAN_MODE_FORCE_DISABLE")
    mode = family().inf_nan_mode.value if family() else None
    if mode in (SATURATES, IEEE_ONLY):
        return mode == IEEE_ONLY  # the one mode the chip has; INF_NAN_MODE_ENABLE has no effect there
    if not enable and not force_disable:
        print(REFUSED_DISABLE, file=sys.stderr, flush=True)
        return True
    return enable


def cann_version() -> str:
    return os.environ.get("VTOOLS_EMU_NPU_CANN_VERSION", DEFAULT_CANN).strip()


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def force_overflow_check() -> bool:
    """FORCE_OVERFLOW_CHECK=1 on a CANN that honours it."""
    if os.environ.get("FORCE_OVERFLOW_CHECK", "0") != "1":
        return False
    return _release(cann_version()) >= FORCE_CHECK_CANN


def apply() -> None:
    """Set the C++ side's overflow mode from the environment (at install, and when posing as a chip)."""
    saturating = not inf_nan_mode()
    forced = force_overflow_check()
    if os.environ.get("FORCE_OVERFLOW_CHECK", "0") == "1" and not forced and not saturating:
        print(OLD_CANN_FORCE.format(version=cann_version()), file=sys.stderr, flush=True)
    load_extension().set_overflow_mode(saturating, forced)


@contextmanager
def posing_as(name: str | None, **environment: str) -> Iterator[None]:
    """Pose as chip ``name`` (None: no chip named) inside this process, with ``environment`` set (e.g.
    ``FORCE_OVERFLOW_CHECK="1"``), then go back; the float-status flags start and end lowered."""
    names = {"VTOOLS_EMU_NPU_CHIP": name or "", **environment}
    saved = {key: os.environ.get(key) for key in names}
    extension = load_extension()
    try:
        os.environ.update(names)
        apply()
        _lower_flags(extension)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        apply()
        _lower_flags(extension)


def _lower_flags(extension) -> None:
    import torch

    for index in range(extension.device_count()):
        torch.ops.npu.npu_clear_float_status(torch.zeros(8, device=f"npu:{index}"))
