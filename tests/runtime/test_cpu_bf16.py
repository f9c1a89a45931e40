"""The host CPU's bfloat16 verdict: the rule on given features, the probe on this host, the tests' stand-in."""

from __future__ import annotations

import platform

import pytest
import torch

from vtools.runtime.cpu_bf16 import EMULATED_FEATURES_ENV, host_bf16, probe_features, verdict

pytestmark = pytest.mark.cpu_only(reason="the verdict is about the host's CPU, whatever device a run uses")


@pytest.mark.parametrize(
    ("features", "native"),
    [
        ({"avx512_bf16", "avx512", "avx2"}, True),  # Cooper Lake, Zen 4
        ({"amx_tile", "avx512_bf16"}, True),  # Sapphire Rapids
        ({"amx_tile"}, True),
        ({"arm_bf16"}, True),  # Graviton 3, Neoverse V1
        ({"avx512", "avx2"}, False),  # Skylake-X: AVX512 without its bfloat16 instructions
        ({"avx2"}, False),  # the host
        (set(), False),
    ],
)
def test_native_bf16_needs_its_instructions(features: set[str], native: bool) -> None:
    assert verdict(features).native is native


def test_the_reason_names_what_is_missing() -> None:
    host = verdict({"avx2"})
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert host.auto_note() == (
            "float32 (this CPU has no native bfloat16: AVX512-BF16/AMX absent; bfloat16 would run ~10x slower)"
        )
    assert host.forced_note().startswith("bfloat16 as asked, though this CPU has no native bfloat16")


def test_the_probe_agrees_with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, the features are torch's own findings here (what its kernels dispatch on)."""
    monkeypatch.delenv(EMULATED_FEATURES_ENV, raising=False)
    found = probe_features()
    assert ("avx512_bf16" in found) == torch.cpu._is_avx512_bf16_supported()
    assert ("amx_tile" in found) == torch.cpu._is_amx_tile_supported()
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert ("avx2" in found) == torch.cpu._is_avx2_supported()


@pytest.mark.parametrize(("value", "native"), [("AVX512_BF16, avx2", True), ("avx2", False), ("", False)])
def test_the_emulated_host_replaces_the_probe(value: str, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATED_FEATURES_ENV, value)
    assert host_bf16().native is native
