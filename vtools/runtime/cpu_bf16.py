"""Whether this host's CPU computes bfloat16 natively, which decides what ``--amp`` means on cpu.

torch runs bfloat16 autocast on any CPU, but only AVX512-BF16 (Cooper Lake, Zen 4 and later) and AMX
(Sapphire Rapids and later) have bfloat16 instructions; elsewhere (AVX2, plain AVX512) every bfloat16 op
converts to float32 and back, and a training step ran about 10x slower than in float32 (issue 60: 17-21
img/s against 140-240 on an AVX2 host). On an Arm CPU torch's oneDNN build answers whether it has the
BF16 extension. The answer comes from torch's own CPU probes, so it matches the kernels torch picks.

Tests name the features of another host in ``VTOOLS_EMU_CPU_FEATURES`` (comma-separated, e.g.
``avx512_bf16`` or ``avx2``; empty: none), as the emulated npu takes its chip from ``VTOOLS_EMU_NPU_CHIP``.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

EMULATED_FEATURES_ENV = "VTOOLS_EMU_CPU_FEATURES"
NATIVE_BF16 = ("avx512_bf16", "amx_tile", "arm_bf16")  # any one of these computes bfloat16 natively
ARM = ("aarch64", "arm64")
SLOWDOWN = "~10x"  # bfloat16 against float32 on a CPU without it (issue 60's measurement)


def _arm_bf16() -> bool:
    """oneDNN's answer on Arm (on x86 it also says yes for plain AVX512, which emulates bfloat16)."""
    return platform.machine().lower() in ARM and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


_PROBES: dict[str, Callable[[], bool]] = {
    "avx512_bf16": lambda: torch.cpu._is_avx512_bf16_supported(),
    "amx_tile": lambda: torch.cpu._is_amx_tile_supported(),
    "arm_bf16": _arm_bf16,
    "avx512": lambda: torch.cpu._is_avx512_supported(),
    "avx2": lambda: torch.cpu._is_avx2_supported(),
}


@dataclass(frozen=True)
class HostBf16:
    """The CPU's bfloat16 verdict and the features it rests on."""

    native: bool
    features: frozenset[str]

    def absent(self) -> str:
        """The instructions that would have made bfloat16 fast, named as this host's architecture names them."""
        missing = "the BF16 extension" if platform.machine().lower() in ARM else "AVX512-BF16/AMX"
        return f"no native bfloat16: {missing} absent"

    def auto_note(self) -> str:
        """The start line's reason for float32 where ``--amp-dtype auto`` would have picked bfloat16."""
        return f"float32 (this CPU has {self.absent()}; bfloat16 would run {SLOWDOWN} slower)"

    def forced_note(self) -> str:
        """The warning for an explicit ``--amp-dtype bfloat16`` on a CPU without it (honoured all the same)."""
        return f"bfloat16 as asked, though this CPU has {self.absent()}: expect it {SLOWDOWN} slower than float32"


def probe_features() -> frozenset[str]:
    """The CPU features torch detects here that matter for bfloat16 (or the emulated host's, in tests)."""
    emulated = os.environ.get(EMULATED_FEATURES_ENV)
    if emulated is not None:
        return frozenset(name.strip().lower() for name in emulated.split(",") if name.strip())
    return frozenset(name for name, probe in _PROBES.items() if _safely(probe))


def _safely(probe: Callable[[], bool]) -> bool:
    """A probe this torch build lacks counts as a missing feature."""
    try:
        return bool(probe())
    except (AttributeError, RuntimeError):
        return False


def verdict(features: Iterable[str]) -> HostBf16:
    """Whether a CPU with ``features`` computes bfloat16 natively: the rule, apart from the probe."""
    found = frozenset(features)
    return HostBf16(native=any(name in found for name in NATIVE_BF16), features=found)


def host_bf16() -> HostBf16:
    """This host's verdict."""
    return verdict(probe_features())
