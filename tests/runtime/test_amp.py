"""The AMP policy on each branch: bf16, fp16 + GradScaler, a bf16-less NPU, cpu."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, assert_usage_error, device_flags, load_emulated_npu, run_script, train_args
from vtools.errors import UsageError
from vtools.runtime.amp import AmpPolicy, resolve_amp
from vtools.runtime.cpu_bf16 import EMULATED_FEATURES_ENV


def test_amp_off_is_full_precision(device: torch.device) -> None:
    policy = resolve_amp(device, amp=False)
    assert not policy.enabled and policy.grad_scaler() is None
    with policy.autocast():
        out = torch.ones(4, 4, device=device) @ torch.ones(4, 4, device=device)
    assert out.dtype == torch.float32


def test_auto_prefers_bf16_without_scaler(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATED_FEATURES_ENV, "avx512_bf16")  # a CPU with native bf16, whatever this host has
    policy = resolve_amp(device, amp=True, amp_dtype="auto")
    assert policy.dtype == torch.bfloat16  # such a cpu, the emulated npu and sm80+ cuda all run bf16
    assert policy.note == ""
    assert policy.grad_scaler() is None
    assert policy.device_type == device.type
    with policy.autocast():
        out = torch.ones(4, 4, device=device) @ torch.ones(4, 4, device=device)
    assert out.dtype == torch.bfloat16


def test_fp16_gets_scaler_for_its_device(device: torch.device) -> None:
    policy = resolve_amp(device, amp=True, amp_dtype="float16")
    scaler = policy.grad_scaler()
    assert policy.dtype == torch.float16 and scaler is not None
    assert scaler._device == device.type
    with policy.autocast():
        out = torch.ones(4, 4, device=device) @ torch.ones(4, 4, device=device)
    assert out.dtype == torch.float16


def test_unknown_amp_dtype(device: torch.device) -> None:
    with pytest.raises(UsageError, match="--amp-dtype"):
        resolve_amp(device, amp=True, amp_dtype="float8")


BF16_PROBE = """
import sys
import tests.emulated_npu
import torch
from vtools.runtime.amp import AmpPolicy, resolve_amp
from vtools.runtime.cpu_bf16 import EMULATED_FEATURES_ENV
from vtools.errors import UsageError
device = torch.device("npu", 0)
policy = resolve_amp(device, amp=True)
print(policy.dtype_name, type(policy.grad_scaler()).__name__, policy.grad_scaler()._device)
try:
    resolve_amp(device, amp=True, amp_dtype="bfloat16")
except UsageError as err:
    print("error:", err)
"""


@pytest.mark.npu_only(reason="an Ascend 910A without bf16 is an npu situation")
def test_npu_without_bf16_chooses_fp16_and_scaler() -> None:
    """Like Ascend 910A: no bf16, so auto must pick fp16 with a GradScaler for npu."""
    proc = run_script(["-c", BF16_PROBE], env={"VTOOLS_EMU_NPU_NO_BF16": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "float16 GradScaler npu"
    assert lines[1].startswith("error: --amp-dtype bfloat16: npu:0 does not support bfloat16")


@pytest.mark.npu_only(reason="an Ascend 910A without bf16 is an npu situation")
def test_cli_explicit_bf16_on_bf16less_npu_is_one_line() -> None:
    proc = run_script(
        ["train.py", "--data-dir", "data/fashion-mnist-mini", *device_flags("npu"), "--amp", "--amp-dtype", "bfloat16"],
        env={"VTOOLS_EMU_NPU_NO_BF16": "1"},
    )
    assert_usage_error(proc, "does not support bfloat16")
    assert REPO.joinpath("train.py").exists()


def test_non_finite_advice_fits_the_precision_and_the_device() -> None:
    """A diverged float16 run is told to use bfloat16 only where the device has it: an Ascend 910A was told
    to use --amp-dtype bfloat16, which it refuses; at bfloat16 or float32 the precision is not the cause."""
    assert (
        AmpPolicy("npu", torch.float16, bf16_supported=True)
        .non_finite_advice()
        .endswith("or use --amp-dtype bfloat16: float16 overflows above 65504")
    )
    on_910a = AmpPolicy("npu", torch.float16, bf16_supported=False).non_finite_advice()
    assert "train without --amp (no bfloat16 here)" in on_910a and "--amp-dtype" not in on_910a
    for dtype in (torch.bfloat16, None):
        assert AmpPolicy("npu", dtype, bf16_supported=False).non_finite_advice() == "lower --lr or add --clip-grad"


@pytest.mark.npu_only(reason="an Ascend 910A without bf16 is an npu situation")
def test_a_910a_policy_advises_full_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    load_emulated_npu()
    monkeypatch.setenv("VTOOLS_EMU_NPU_CHIP", "910A")
    policy = resolve_amp(torch.device("npu", 0), amp=True)
    assert policy.dtype == torch.float16 and not policy.bf16_supported
    assert "train without --amp" in policy.non_finite_advice()


@pytest.mark.parametrize("features", ["avx2", "avx512,avx2", ""])
def test_auto_on_a_cpu_without_native_bf16_is_float32_and_says_why(
    device: torch.device, features: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AVX2-only CPU trained 8-10x slower under --amp (bfloat16 emulated): auto keeps such a host's cores in
    float32 with the reason; an accelerator's choice does not depend on the host's CPU."""
    monkeypatch.setenv(EMULATED_FEATURES_ENV, features)
    policy = resolve_amp(device, amp=True, amp_dtype="auto")
    if device.type == "cpu":
        assert policy.dtype is None and not policy.enabled and policy.grad_scaler() is None
        assert policy.describe() == policy.note
        assert policy.note.startswith("float32 (this CPU has no native bfloat16: AVX512-BF16/AMX absent")
        assert policy.note.endswith("bfloat16 would run ~10x slower)")
    else:
        assert policy.dtype == torch.bfloat16 and policy.note == ""


@pytest.mark.cpu_only(reason="an explicit dtype on a CPU without native bf16 is a host situation")
def test_explicit_bf16_on_such_a_cpu_is_honoured_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATED_FEATURES_ENV, "avx2")
    policy = resolve_amp(torch.device("cpu"), amp=True, amp_dtype="bfloat16")
    assert policy.dtype == torch.bfloat16
    assert policy.note.startswith("bfloat16 as asked, though this CPU has no native bfloat16")
    assert resolve_amp(torch.device("cpu"), amp=True, amp_dtype="float16").note == ""
    monkeypatch.setenv(EMULATED_FEATURES_ENV, "amx_tile")
    assert resolve_amp(torch.device("cpu"), amp=True, amp_dtype="bfloat16").note == ""


@pytest.mark.cpu_only(reason="the host CPU's bfloat16 decides cpu's --amp")
@pytest.mark.parametrize(
    ("features", "precision", "line"),
    [
        ("avx2", "float32", "amp: float32 (this CPU has no native bfloat16: AVX512-BF16/AMX absent;"),
        ("avx512_bf16,avx512,avx2", "bfloat16", None),
    ],
)
def test_the_readme_amp_example_follows_the_cpu(
    features: str, precision: str, line: str | None, fashion4: Path, tmp_path: Path
) -> None:
    """The README's --amp example on an AVX2-only CPU ran bfloat16 at 17-21 img/s against 140-240 in float32."""
    host = {EMULATED_FEATURES_ENV: features}
    proc = run_script(train_args(fashion4, tmp_path, "amp", "--amp", "--epochs", "1", "--device", "cpu"), env=host)
    assert proc.returncode == 0, proc.stderr
    start = next(text for text in proc.stdout.splitlines() if text.startswith("training "))
    assert f"on cpu ({precision})" in start, start
    assert (line in proc.stdout) if line else ("\namp: " not in proc.stdout), proc.stdout
    env = run_script(["-m", "vtools", "env", "--device", "cpu"], env=host)
    assert f"amp_policy: {precision}" in env.stdout, env.stdout
