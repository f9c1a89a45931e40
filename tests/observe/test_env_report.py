"""``python -m vtools env``, the bug-report command, with broken, hidden and emulated backends.

Broken backends are reproduced for real: a fake ``torch_npu`` package that fails
to import, and a fake distribution whose ``torch.backends`` entry point fails,
which is exactly how torch_npu without CANN breaks ``import torch``. The scripts'
one-line device errors are rows of tests/scripts/test_one_line_errors.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import (
    EMULATED_NPU_MODULE,
    REPO,
    assert_usage_error,
    autoload_env,
    broken_autoload_backend,
    broken_torch_npu_package,
    run_script,
)

pytestmark = pytest.mark.cpu_only(
    reason="each test sets up the device situation it checks (missing, broken, hidden, out-of-range backends)"
)


def test_env_with_broken_backend_reports_everything_else(tmp_path: Path) -> None:
    """The bug-report command must not stop at the failure: versions and environment still print, and
    torch_npu is named with its version and import error, whether asked for npu or not."""
    broken_torch_npu_package(tmp_path)
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}

    asked = run_script(["-m", "vtools", "env", "--device", "npu"], env=env)
    plain = run_script(["-m", "vtools", "env"], env=env)

    assert_usage_error(asked, "torch_npu is installed but failed to load", "libascendcl.so")
    assert plain.returncode == 0, plain.stderr
    for proc in (asked, plain):
        for line in ("torch: ", "timm: ", "environment:", "ASCEND_RT_VISIBLE_DEVICES="):
            assert line in proc.stdout, (line, proc.stdout)
        assert "torch_npu: 2.14.0 (installed, fails to import: ImportError: libascendcl.so" in proc.stdout
    assert "device: cpu" in plain.stdout and "amp_policy:" in plain.stdout


def test_autoload_off_bypasses_broken_backend(tmp_path: Path) -> None:
    broken_autoload_backend(tmp_path)

    proc = run_script(
        ["-m", "vtools", "env", "--device", "cpu"],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "device: cpu" in proc.stdout


def test_env_report_on_emulated_npu() -> None:
    proc = run_script(
        ["-m", "vtools", "env", "--device", "npu", "--device-modules", EMULATED_NPU_MODULE],
        env={"VTOOLS_EMU_NPU_CHIP": "910A"},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in (
        "torch: ",
        "timm: ",
        "device: npu:0",
        "device_count: 2",
        "amp_policy: float16",
        "grad_scaler: True",
        "overflow: overflow detected through the chip's float-status flag",
        "FORCE_OVERFLOW_CHECK=unset",
        "ASCEND_RT_VISIBLE_DEVICES=",
        "TORCH_DEVICE_BACKEND_AUTOLOAD=",
        "tuning: none",
    ):
        assert expected in out, (expected, out)
    assert out.split("dist_backend:")[1].splitlines()[0].strip() == "hccl"  # tests/emulated_npu/process_group.py


def test_the_reported_variables_come_from_the_device_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row's variables are reported (mlu's and hpu's too), and a new row needs no edit of the report."""
    from vtools.observe import env_report
    from vtools.runtime import device as dev

    names = env_report.environment_variables()
    for kind in dev.DEVICE_KINDS.values():
        assert set(kind.environment_variables()) <= set(names), kind.type
    assert {"MLU_VISIBLE_DEVICES", "HABANA_VISIBLE_MODULES", "ASCEND_TOOLKIT_HOME", "LOCAL_RANK"} <= set(names)

    row = dev.DeviceKind("newdev", visible_env="NEWDEV_VISIBLE", toolkit="newkit", toolkit_home_env=("NEWKIT_HOME",))
    monkeypatch.setitem(dev.DEVICE_KINDS, "newdev", row)
    monkeypatch.setenv("NEWKIT_HOME", "/opt/newkit")
    assert {"NEWDEV_VISIBLE", "NEWKIT_HOME"} <= set(env_report.environment_variables())
    assert env_report.backend_versions()["newkit"] == "/opt/newkit"


STATUS_SAMPLE = Path(__file__).resolve().parent.parent / "data" / "status" / "npu_smi_info.txt"


def fake_tool(folder: Path, name: str, body: str) -> dict[str, str]:
    """An executable ``name`` in ``folder`` running the shell ``body``; the PATH that finds it first."""
    folder.mkdir(exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_the_report_carries_the_vendor_status_tool(tmp_path: Path) -> None:
    """npu-smi info on PATH (a fake printing a table in its layout, with a busy card 5): its output in the report,
    indented; a failing one says its exit code; none on PATH says so."""
    env = {**autoload_env(), **fake_tool(tmp_path / "bin", "npu-smi", f"cat {STATUS_SAMPLE}")}
    proc = run_script(["-m", "vtools", "env", "--device", "npu"], env=env)
    assert proc.returncode == 0, proc.stderr
    status = proc.stdout.split("status: npu-smi info:\n", 1)[1].splitlines()
    assert status == [f"  {line}" for line in STATUS_SAMPLE.read_text().splitlines()]


def test_a_failing_or_missing_status_tool_is_said_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vtools.observe.env_report import vendor_status

    broken = fake_tool(tmp_path / "broken", "npu-smi", "echo 'dcmi model initialized failed'; exit 3")
    monkeypatch.setenv("PATH", broken["PATH"])
    assert vendor_status(("npu-smi", "info")) == "npu-smi info (exit 3):\n  dcmi model initialized failed"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert vendor_status(("npu-smi", "info")) == "npu-smi info: not on PATH"
