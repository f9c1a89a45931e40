"""Ascend's chip families as data: what vtools relies on that differs between chips of the one npu type.

The device table (device_kinds.py) has one row for npu, but its chips differ where a run must know: the Atlas
training series (910A) saturates instead of producing inf and has no bfloat16, the Atlas A2 (910B) and A3
(910_93) series compile operators differently, Ascend950 runs Adam's fused step that the others run on the host.
Each family here lists the SoC names the backend reports (``get_device_name``, from ``aclrtGetSocName``) and
one :class:`Cell` per behaviour, each with its source: a document of Ascend's (CANN, the PyTorch adapter) named
with its version, and where the torch_npu 2.14.0 wheel states it too, the file or library string that does
(tests/runtime/test_device_kinds_wheel.py finds every such string in the real wheel; a document-only cell says
so). docs/devices.md prints the table with its sources. A chip is found by its name (:func:`family_of`); a
device whose name no family claims (another vendor's, the emulator with no chip named) gets the row's defaults.
Like device.py, this module may name the backend's package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LIBRARY = "lib/libtorch_npu.so"  # a wheel source that is the library's strings rather than a Python file


@dataclass(frozen=True)
class Cell:
    """One behaviour of a chip family, with where it is stated."""

    value: Any
    source: str  # the document (with its version), or the wheel's own words
    wheel: tuple[str, str] | None = None  # (file under torch_npu/ or LIBRARY, text in it) that states it too


@dataclass(frozen=True)
class ChipFamily:
    """What vtools relies on that differs between Ascend chip families."""

    key: str  # the emulator's VTOOLS_EMU_NPU_CHIP for a chip of the family
    name: str
    socs: tuple[str, ...]  # SoC names get_device_name reports, each in the wheel's library
    inf_nan_mode: Cell  # SATURATES, IEEE (Inf/NaN, saturation only when forced) or IEEE_ONLY
    bf16: Cell  # bfloat16 compute
    jit_compile: Cell  # the backend's default: operators compiled for each new shape
    fused_steps: Cell  # the fused optimizer kernels (aten::_fused_<opt>_) that run on the device
    internal_format: Cell  # torch.npu.config.allow_internal_format's default
    collective_timeout: Cell  # HCCL_EXEC_TIMEOUT's range in seconds: (lowest, highest), or None if undocumented

    def cells(self) -> dict[str, Cell]:
        return {name: getattr(self, name) for name in CELL_NAMES}


SATURATES, IEEE, IEEE_ONLY = "saturation only", "Inf/NaN (saturation when forced)", "Inf/NaN only"
CELL_NAMES = ("inf_nan_mode", "bf16", "jit_compile", "fused_steps", "internal_format", "collective_timeout")

_OVERFLOW_DOC = "CANN 8.5.0 runtime API, aclrtFloatOverflowMode"
_SATURATION_API = ("npu/utils.py", "Unsupported api when soc_version >= Ascend910B1")
_JIT_DOC = "PyTorch adapter 7.0.0 API reference, torch_npu.npu.set_compile_mode"
_FORMAT_DOC = "PyTorch adapter 6.0.0 API reference, torch_npu.npu.config.allow_internal_format"
_TIMEOUT_DOC = "CANN 8.5.0 environment variables, HCCL_EXEC_TIMEOUT"
_BF16_DOC = "CANN 8.5.0 aclnn API reference: BFLOAT16 is listed for Atlas A2/A3 and Ascend950, not Atlas training"
_ADAM_ON_HOST = (LIBRARY, "CAUTION: The operator 'aten::_fused_adam_' is not currently supported on the NPU backend")
_FUSED_KERNELS = (LIBRARY, "wrapper_NPU___fused_sgd_")  # and wrapper_NPU___fused_adamw_: NPU kernels exist
_INT32_MAX = 2147483647

CHIP_FAMILIES: tuple[ChipFamily, ...] = (
    ChipFamily(
        key="910A",
        name="Atlas training series (910A)",
        socs=("Ascend910A", "Ascend910ProA", "Ascend910PremiumA", "Ascend910ProB", "Ascend910B"),
        inf_nan_mode=Cell(
            SATURATES, f"{_OVERFLOW_DOC}: Atlas training products support only the saturation mode", _SATURATION_API
        ),
        bf16=Cell(False, _BF16_DOC),
        jit_compile=Cell(True, f"{_JIT_DOC}: Atlas training products default to jit_compile=True"),
        fused_steps=Cell(
            frozenset(),
            "the wheel runs _fused_adam_ on the host below Ascend950; whether its _fused_adamw_/_fused_sgd_ "
            "kernels (aclnn) run on this series is not documented: per-tensor steps",
            _ADAM_ON_HOST,
        ),
        internal_format=Cell(True, f"{_FORMAT_DOC}: Atlas training products default to True"),
        collective_timeout=Cell(
            (1, 17340), f"{_TIMEOUT_DOC}: Atlas training products (0, 17340], rounded down to 68 s"
        ),
    ),
    ChipFamily(
        key="910B",
        name="Atlas A2 training series (910B)",
        socs=("Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3", "Ascend910B4", "Ascend910B4-1"),
        inf_nan_mode=Cell(IEEE, f"{_OVERFLOW_DOC}: Inf/NaN by default on Atlas A2", _SATURATION_API),
        bf16=Cell(True, _BF16_DOC),
        jit_compile=Cell(False, f"{_JIT_DOC}: Atlas A2/A3 training products default to jit_compile=False"),
        fused_steps=Cell(
            frozenset({"_fused_adamw_", "_fused_sgd_"}),
            "the wheel has NPU kernels for _fused_adamw_ and _fused_sgd_ and announces _fused_adam_ as a host "
            "fallback below Ascend950",
            _FUSED_KERNELS,
        ),
        internal_format=Cell(
            False, "torch_npu 2.8.0 and later (Ascend/pytorch pull request 31602): False by default on Atlas A2"
        ),
        collective_timeout=Cell((0, _INT32_MAX), f"{_TIMEOUT_DOC}: Atlas A2 [0, 2147483647], 0 never times out"),
    ),
    ChipFamily(
        key="910_93",
        name="Atlas A3 training series (910_93)",
        socs=(
            "Ascend910_9391",
            "Ascend910_9392",
            "Ascend910_9381",
            "Ascend910_9382",
            "Ascend910_9372",
            "Ascend910_9362",
            "Ascend910_9363",
        ),
        inf_nan_mode=Cell(IEEE, f"{_OVERFLOW_DOC}: Inf/NaN by default on Atlas A3", _SATURATION_API),
        bf16=Cell(True, _BF16_DOC),
        jit_compile=Cell(False, f"{_JIT_DOC}: Atlas A2/A3 training products default to jit_compile=False"),
        fused_steps=Cell(
            frozenset({"_fused_adamw_", "_fused_sgd_"}),
            "as on Atlas A2: NPU kernels for _fused_adamw_ and _fused_sgd_, _fused_adam_ on the host",
            _FUSED_KERNELS,
        ),
        internal_format=Cell(False, f"{_FORMAT_DOC}: Atlas A3 training products default to False"),
        collective_timeout=Cell((0, _INT32_MAX), f"{_TIMEOUT_DOC}: Atlas A3 [0, 2147483647], 0 never times out"),
    ),
    ChipFamily(
        key="950",
        name="Ascend950 (950PR, 950DT)",
        socs=("Ascend950PR_9599", "Ascend950PR_9589", "Ascend950DT_9591", "Ascend950DT_9571"),
        inf_nan_mode=Cell(IEEE_ONLY, f"{_OVERFLOW_DOC}: Ascend 950PR/950DT support only the Inf/NaN mode"),
        bf16=Cell(True, _BF16_DOC),
        jit_compile=Cell(
            False,
            "the wheel refuses jit compilation on devices that only run aclnn operators",
            (LIBRARY, "Current device only support jit_compile=False"),
        ),
        fused_steps=Cell(
            frozenset({"_fused_adam_", "_fused_adamw_", "_fused_sgd_"}),
            "the wheel's host fallback for _fused_adam_ applies below Ascend950 only (not stated in its strings: "
            "the condition is compiled)",
            _FUSED_KERNELS,
        ),
        internal_format=Cell(
            False,
            "the wheel refuses internal formats on devices that only run aclnn operators",
            (LIBRARY, "do not support internal format"),
        ),
        collective_timeout=Cell(None, f"{_TIMEOUT_DOC} lists no range for Ascend950: not checked"),
    ),
)


def family_of(soc: str, families: tuple[ChipFamily, ...] = CHIP_FAMILIES) -> ChipFamily | None:
    """The family of ``families`` whose SoC names include ``soc`` (``Ascend910B3``); None for a name none claims.
    Ascend950 has many SoC names (``Ascend950PR_957c``...): any name its listed ones share a prefix with is its."""
    for family in families:
        if soc in family.socs or (family.key == "950" and soc.startswith("Ascend950")):
            return family
    return None


def family_by_key(key: str) -> ChipFamily:
    """The family the emulator's VTOOLS_EMU_NPU_CHIP value names (``910A``, ``910B``, ``910_93``, ``950``)."""
    return next(family for family in CHIP_FAMILIES if family.key == key)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, frozenset):
        return ", ".join(f"`{kernel}`" for kernel in sorted(value)) or "none"
    if isinstance(value, tuple):
        return f"{value[0]}-{value[1]} s"
    return "not documented" if value is None else str(value)


def table_markdown() -> str:
    """The table as docs/devices.md prints it: a row per behaviour, a column per family, then the sources
    (a test keeps the page equal to this)."""
    head = "| | " + " | ".join(family.name for family in CHIP_FAMILIES) + " |"
    lines = [head, "|---" * (len(CHIP_FAMILIES) + 1) + "|"]
    lines.append("| SoC names | " + " | ".join(", ".join(f.socs) for f in CHIP_FAMILIES) + " |")
    for name in CELL_NAMES:
        row = [_shown(family.cells()[name].value) for family in CHIP_FAMILIES]
        lines.append(f"| {CELL_TITLES[name]} | " + " | ".join(row) + " |")
    lines += ["", "Sources (*wheel*: also stated in the torch_npu 2.14.0 wheel, checked by a test):", ""]
    for family in CHIP_FAMILIES:
        for name, cell in family.cells().items():
            wheel = f"; *wheel*: `{cell.wheel[1]}` in `{cell.wheel[0]}`" if cell.wheel else ""
            lines.append(f"- {family.key}, {CELL_TITLES[name]}: {cell.source}{wheel}")
    return "\n".join(lines)


CELL_TITLES = {
    "inf_nan_mode": "overflow",
    "bf16": "bfloat16",
    "jit_compile": "jit_compile by default",
    "fused_steps": "fused optimizer steps on the device",
    "internal_format": "allow_internal_format by default",
    "collective_timeout": "HCCL_EXEC_TIMEOUT range",
}
