"""vtools/runtime/overflow.py: the overflow mode is asked of the backend, and the flag is read on the device."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import NPU_910A, load_emulated_npu
from vtools.runtime.overflow import FloatStatusFlag, OverflowMode, float_status_flag, overflow_mode


def test_only_a_saturating_chip_reads_its_flag(chip_device: torch.device) -> None:
    mode = overflow_mode(chip_device)
    saturating = chip_device.type == "npu" and not torch.npu.utils.is_support_inf_nan()
    assert mode == OverflowMode(saturates=saturating, flag=saturating)
    assert (float_status_flag(chip_device, mode) is not None) == saturating
    assert "float-status flag" in mode.describe() if saturating else mode.describe() == "overflow gives inf/NaN (IEEE)"


@pytest.mark.npu_only(reason="the backend's own answers, not a chip's name, decide (the emulated npu's modes)")
@pytest.mark.parametrize(
    ("chip", "environment", "expected"),
    [
        ("910A", {}, OverflowMode(saturates=True, flag=True)),
        ("910B", {}, OverflowMode()),
        ("910B", {"FORCE_OVERFLOW_CHECK": "1"}, OverflowMode(saturates=False, flag=True)),
        ("910B", {"INF_NAN_MODE_ENABLE": "0", "INF_NAN_MODE_FORCE_DISABLE": "1"}, OverflowMode(True, True)),
    ],
    ids=["910A", "910B", "910B-forced-check", "910B-forced-saturation"],
)
def test_the_mode_follows_what_the_backend_says(chip: str, environment: dict[str, str], expected: OverflowMode) -> None:
    load_emulated_npu()
    from tests.emulated_npu.chips import posing_as

    with posing_as(chip, **environment):
        assert overflow_mode(torch.device("npu")) == expected


@pytest.mark.npu_only(reason="the float-status flag exists on the (emulated) Ascend chips only")
def test_the_flag_is_read_and_cleared_without_waiting_for_the_device() -> None:
    load_emulated_npu()
    import tests.emulated_npu as emulated
    from tests.emulated_npu.chips import posing_as

    with posing_as(NPU_910A.split("-")[1]):
        flag = FloatStatusFlag(torch.device("npu:0"))
        syncs = emulated.extension().sync_count()
        flag.clear()
        before = flag.raised()
        torch.exp(torch.full((), 12.0, dtype=torch.float16, device="npu:0"))
        after = flag.raised()
        flag.clear()
        cleared = flag.raised()
        assert emulated.extension().sync_count() == syncs  # three reads, one clear: all on the device
        assert (before.device.type, before.dtype, before.shape) == ("npu", torch.bool, ())
        assert [bool(before), bool(after), bool(cleared)] == [False, True, False]


def test_a_device_without_a_flag_has_none_to_read() -> None:
    with pytest.raises(ValueError, match="cpu keeps no float-status flag"):
        FloatStatusFlag(torch.device("cpu"))
