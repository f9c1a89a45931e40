"""tests/emulated_npu/device_time.py: a slow kernel that returns at once and keeps the emulated device busy, so
that a timer which does not wait for the device measures less than one that does (as on a real NPU)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_script

pytestmark = pytest.mark.npu_only(reason="the emulated npu's asynchronous slow kernel")

TIMELINE = """
import json, time, torch, tests.emulated_npu as emulator
from tests.emulated_npu import device_time
emulator.install()
a, b, c = torch.ones(8, 8, device="npu"), torch.ones(8, 8, device="npu"), torch.zeros(8, device="npu")
began = time.monotonic()
for _ in range(3):
    out = torch.addmm(c, a, b)
queued = device_time._busy_until - time.monotonic()  # device time still ahead after the launches returned
torch.npu.synchronize()
synced = time.monotonic() - began
for _ in range(2):
    out = torch.addmm(c, a, b)
began = time.monotonic()
value = out.sum().item()
print(json.dumps({"queued": queued, "synced": synced, "item": time.monotonic() - began, "value": value}))
"""


def timeline(milliseconds: str) -> dict:
    env = {"VTOOLS_EMU_NPU_SLOW_OP": "aten::addmm", "VTOOLS_EMU_NPU_SLOW_MS": milliseconds}
    proc = run_script(["-c", TIMELINE], env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_launches_return_before_the_device_time_and_waits_include_it() -> None:
    """Three 400 ms kernels: once launched, most of their 1.2 s is still ahead of the host; synchronize
    returns only after all of it, and .item() after the two kernels queued before it (lower bounds only:
    a loaded host makes each wait longer, never shorter). The results are the kernels' own."""
    seen = timeline("400")
    assert seen["queued"] > 0.6, seen  # launching three tiny matrix products took less than 0.6 s
    assert seen["synced"] >= 1.2 and seen["item"] >= 0.8, seen
    assert seen["value"] == 8 * 8 * 8


def test_a_bad_duration_is_refused_when_the_emulator_installs() -> None:
    proc = run_script(["-c", TIMELINE], env={"VTOOLS_EMU_NPU_SLOW_OP": "aten::addmm", "VTOOLS_EMU_NPU_SLOW_MS": "-5"})
    assert proc.returncode != 0 and "VTOOLS_EMU_NPU_SLOW_MS must be a positive number of milliseconds" in proc.stderr
