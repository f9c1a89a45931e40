"""The emulated npu overflows as each Ascend chip does: IEEE on a 910B, saturated with a flag on a 910A.

CANN's INF_NAN_MODE_ENABLE page gives the example these tests start from: float16 ``exp(12)`` is inf in
Inf/NaN mode and 65504 in saturation mode (and ``sqrt(-1)`` NaN or 0). The flag protocol and the messages
are torch_npu's (tests/runtime/test_device_kinds_wheel.py reads them in the wheel).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from tests.conftest import load_emulated_npu, run_script

load_emulated_npu()

from tests.emulated_npu import chips  # noqa: E402

pytestmark = pytest.mark.npu_only(reason="the emulated npu's own arithmetic per chip")

NPU = torch.device("npu:0")
TWELVE = torch.tensor(12.0, dtype=torch.float16)


def raised() -> bool:
    return bool(torch.ops.npu.npu_get_float_status(torch.zeros(8, device=NPU))[0] != 0)


@pytest.mark.parametrize("chip", [None, "910B", "910B3"])
def test_an_inf_nan_chip_computes_as_ieee_and_keeps_no_flag(chip: str | None) -> None:
    with chips.posing_as(chip):
        assert torch.npu.utils.is_support_inf_nan() and not torch.npu.utils.is_force_overflow_check()
        assert torch.exp(TWELVE.to(NPU)).item() == math.inf
        assert math.isnan(torch.sqrt(torch.tensor(-1.0, dtype=torch.float16, device=NPU)).item())
        assert not raised()


def test_a_910a_saturates_and_raises_its_flag() -> None:
    """float16 and float32 alike: inf becomes the dtype's largest value, NaN becomes 0; the flag stays up
    until cleared, whatever ran in between."""
    with chips.posing_as("910A"):
        assert not torch.npu.utils.is_support_inf_nan()
        assert torch.exp(TWELVE.to(NPU)).item() == 65504.0
        assert raised()
        torch.ones(3, device=NPU).add_(1)  # a finite op leaves it up
        assert raised()
        torch.ops.npu.npu_clear_float_status(torch.zeros(8, device=NPU))
        assert not raised()
        assert torch.sqrt(torch.tensor(-1.0, dtype=torch.float16, device=NPU)).item() == 0.0
        assert raised()
        huge = torch.full((2,), 3e38, device=NPU) * 10
        assert huge.tolist() == [torch.finfo(torch.float32).max] * 2
        lowest = torch.full((1,), -3e38, device=NPU) * 10
        assert lowest.item() == torch.finfo(torch.float32).min
        assert torch.exp(TWELVE).item() == math.inf  # the host is IEEE


def test_the_flag_is_kept_per_device() -> None:
    with chips.posing_as("910A"):
        torch.exp(TWELVE.to("npu:1"))
        assert not raised()
        assert bool(torch.ops.npu.npu_get_float_status(torch.zeros(8, device="npu:1"))[0] != 0)


def test_the_utils_functions_read_and_lower_the_flag_as_the_wheels() -> None:
    with chips.posing_as("910A"):
        assert torch.npu.get_npu_overflow_flag() is False
        torch.exp(TWELVE.to(NPU))
        assert torch.npu.get_npu_overflow_flag() is True
        assert torch.npu.utils.npu_check_overflow(torch.zeros(2, device=NPU)) is True  # the flag, not the values
        assert torch.npu.utils.npu_check_overflow(torch.zeros(2, device=NPU)) is False  # it lowered the flag
        torch.exp(TWELVE.to(NPU))
        torch.npu.clear_npu_overflow_flag()
        assert not raised()
        assert torch.ops.npu.npu_alloc_float_status(torch.zeros(1, device=NPU)).tolist() == [0.0] * 8


def test_on_an_inf_nan_chip_the_flag_functions_refuse_or_warn_and_the_check_reads_values() -> None:
    with chips.posing_as("910B"):
        with pytest.raises(RuntimeError, match="^Unsupported api when soc_version >= Ascend910B1"):
            torch.npu.get_npu_overflow_flag()
        with pytest.warns(UserWarning, match="clear_npu_overflow_flag is useless"):
            torch.npu.clear_npu_overflow_flag()
        assert torch.npu.utils.npu_check_overflow(torch.tensor([1.0, math.inf], device=NPU)) is True
        assert torch.npu.utils.npu_check_overflow(torch.tensor([1.0, 2.0], device=NPU)) is False
        assert torch.npu.utils.npu_check_overflow(math.nan) is True


def test_force_overflow_check_keeps_the_flag_on_an_inf_nan_chip_from_cann_9_1() -> None:
    with chips.posing_as("910B", FORCE_OVERFLOW_CHECK="1"):
        assert torch.npu.utils.is_support_inf_nan() and torch.npu.utils.is_force_overflow_check()
        assert torch.exp(TWELVE.to(NPU)).item() == math.inf  # still IEEE
        assert torch.npu.get_npu_overflow_flag() is True
    with chips.posing_as("910B", FORCE_OVERFLOW_CHECK="1", VTOOLS_EMU_NPU_CANN_VERSION="9.0.0"):
        assert not torch.npu.utils.is_force_overflow_check()
        torch.exp(TWELVE.to(NPU))
        assert not raised()


def test_a_910b_saturates_only_when_forced_to() -> None:
    """INF_NAN_MODE_ENABLE=0 alone is refused on an A2 chip (the wheel's words); with
    INF_NAN_MODE_FORCE_DISABLE=1 it saturates like a 910A. On a 910A the variable changes nothing."""
    with chips.posing_as("910B", INF_NAN_MODE_ENABLE="0", INF_NAN_MODE_FORCE_DISABLE="1"):
        assert not torch.npu.utils.is_support_inf_nan()
        assert torch.exp(TWELVE.to(NPU)).item() == 65504.0 and raised()
    with chips.posing_as("910A", INF_NAN_MODE_ENABLE="1"):
        assert not torch.npu.utils.is_support_inf_nan()


def test_a_refused_mode_change_says_so_and_a_bad_value_stops() -> None:
    code = "import tests.emulated_npu, torch; print(torch.npu.utils.is_support_inf_nan())"
    refused = run_script(["-c", code], env={"INF_NAN_MODE_ENABLE": "0", "VTOOLS_EMU_NPU_CHIP": "910B"})
    assert refused.returncode == 0 and refused.stdout.strip() == "True", refused.stderr
    assert chips.REFUSED_DISABLE in refused.stderr
    old = run_script(["-c", code], env={"FORCE_OVERFLOW_CHECK": "1", "VTOOLS_EMU_NPU_CANN_VERSION": "8.5.0"})
    assert chips.OLD_CANN_FORCE.format(version="8.5.0") in old.stderr
    bad = run_script(["-c", code], env={"INF_NAN_MODE_FORCE_DISABLE": "yes"})
    assert bad.returncode != 0 and "INF_NAN_MODE_FORCE_DISABLE should be 0 or 1." in bad.stderr


def _scaled_step(grads: list[torch.Tensor]) -> tuple[float, list[list[float]]]:
    found = torch.zeros((), device=NPU)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((), 0.5, device=NPU))
    return found.item(), [grad.tolist() for grad in grads]


def test_the_unscale_kernel_asks_the_flag_where_the_chip_saturates() -> None:
    """torch_npu's saturation-mode kernel: a raised flag sets found_inf, is lowered, and leaves the gradients
    scaled (they hold no inf to find); a lowered one unscales. In Inf/NaN mode the values decide."""
    with chips.posing_as("910A"):
        assert _scaled_step([torch.full((2,), 4.0, device=NPU)]) == (0.0, [[2.0, 2.0]])
        torch.exp(TWELVE.to(NPU))
        assert _scaled_step([torch.full((2,), 4.0, device=NPU)]) == (1.0, [[4.0, 4.0]])
        assert not raised()
    with chips.posing_as("910B"):
        torch.exp(TWELVE.to(NPU))  # an inf elsewhere: not in the gradients
        assert _scaled_step([torch.full((2,), 4.0, device=NPU)]) == (0.0, [[2.0, 2.0]])
        found, _ = _scaled_step([torch.tensor([4.0, math.inf], device=NPU)])
        assert found == 1.0


def test_a_saturating_chip_behind_torch_grad_scaler_skips_exactly_the_flagged_step() -> None:
    """torch's own GradScaler on the emulated 910A: the device kernel is what sees the overflow."""
    with chips.posing_as("910A"):
        weight = torch.nn.Parameter(torch.ones(2, device=NPU))
        optimizer = torch.optim.SGD([weight], lr=1.0)
        scaler = torch.amp.GradScaler("npu", init_scale=4.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for overflow in (True, False):
                loss = (weight * 2).sum()
                scaler.scale(loss).backward()
                if overflow:
                    torch.exp(TWELVE.to(NPU))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        assert scaler.get_scale() == 2.0 and weight.tolist() == [-1.0, -1.0]
