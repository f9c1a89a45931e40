"""Every device error ends a script with one line on stderr and exit code 2.

Broken and missing backends are reproduced for real: a fake ``torch_npu``
package that fails to import, and a fake distribution whose ``torch.backends``
entry point fails, which is exactly how torch_npu without CANN breaks
``import torch``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import EMULATED_NPU_MODULE, REPO, assert_usage_error, run_script

pytestmark = pytest.mark.cpu_only(
    reason="each test sets up the device situation it checks (missing, broken, hidden, out-of-range backends)"
)

SCRIPTS = ["train.py", "validate.py", "inference.py"]


def _script_args(script: str) -> list[str]:
    """The smallest valid non-device arguments of each script."""
    return [script]


@pytest.mark.parametrize("script", SCRIPTS)
def test_malformed_spec(script: str) -> None:
    assert_usage_error(run_script([*_script_args(script), "--device", "npu:x"]), "malformed --device 'npu:x'")


def test_negative_index() -> None:
    assert_usage_error(run_script([*_script_args("validate.py"), "--device", "cuda:-1"]), "malformed", "cuda:-1")


def test_unknown_device_type() -> None:
    assert_usage_error(
        run_script([*_script_args("inference.py"), "--device", "quantum"]), "unknown device type 'quantum'"
    )


def test_backend_not_installed() -> None:
    proc = run_script([*_script_args("train.py"), "--device", "npu"])
    assert_usage_error(proc, "needs the package torch_npu, which is not installed", "torch")


def test_backend_installed_but_broken(tmp_path: Path) -> None:
    """torch_npu importable but failing (no CANN), with autoload off so torch itself imports."""
    _broken_torch_npu_package(tmp_path)
    proc = run_script(
        [*_script_args("validate.py"), "--device", "npu"],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert_usage_error(proc, "torch_npu is installed but failed to load", "libascendcl.so", "set_env.sh")


def _broken_torch_npu_package(root: Path) -> None:
    """An installed torch_npu 2.14.0 whose import fails as it does without CANN."""
    package = root / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('libascendcl.so: cannot open shared object file: No such file or directory')\n"
    )
    dist_info = root / "torch_npu-2.14.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.14.0\n")


def test_env_with_broken_backend_reports_everything_else(tmp_path: Path) -> None:
    """The bug-report command must not stop at the failure: versions and environment still print, and
    torch_npu is named with its version and import error, whether asked for npu or not."""
    _broken_torch_npu_package(tmp_path)
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


def _broken_autoload_backend(root: Path) -> None:
    """A distribution that registers a torch.backends entry point which raises, like torch_npu w/o CANN."""
    (root / "fake_ascend_backend.py").write_text(
        "def autoload():\n    raise ImportError('libhccl.so: cannot open shared object file')\n"
    )
    dist_info = root / "torch_npu-2.14.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.14.0\n")
    (dist_info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = fake_ascend_backend:autoload\n")


@pytest.mark.parametrize("script", SCRIPTS)
def test_backend_breaks_import_torch(script: str, tmp_path: Path) -> None:
    _broken_autoload_backend(tmp_path)

    proc = run_script([*_script_args(script), "--device", "cpu"], env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert_usage_error(
        proc, "Failed to load the backend extension", "TORCH_DEVICE_BACKEND_AUTOLOAD=0", "set_env.sh", "libhccl.so"
    )


def test_autoload_off_bypasses_broken_backend(tmp_path: Path) -> None:
    _broken_autoload_backend(tmp_path)

    proc = run_script(
        ["-m", "vtools", "env", "--device", "cpu"],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "device: cpu" in proc.stdout


def test_type_present_but_unavailable() -> None:
    """The emulated npu with every device hidden: the type exists, no device is visible."""
    proc = run_script(
        [*_script_args("validate.py"), "--device", "npu", "--device-modules", EMULATED_NPU_MODULE],
        env={"ASCEND_RT_VISIBLE_DEVICES": ""},
    )
    assert_usage_error(proc, "no device is available", "ASCEND_RT_VISIBLE_DEVICES=")


def test_index_out_of_range_names_visibility() -> None:
    proc = run_script(
        [*_script_args("inference.py"), "--device", "npu:3", "--device-modules", EMULATED_NPU_MODULE],
        env={"ASCEND_RT_VISIBLE_DEVICES": "4,5"},
    )
    assert_usage_error(proc, "npu:3 requested, 2 visible; ASCEND_RT_VISIBLE_DEVICES=4,5")


def test_unimportable_device_module() -> None:
    proc = run_script([*_script_args("train.py"), "--device", "npu", "--device-modules", "no_such_mod"])
    assert_usage_error(proc, "--device-modules: cannot import 'no_such_mod'")


def test_env_report_on_emulated_npu() -> None:
    proc = run_script(
        ["-m", "vtools", "env", "--device", "npu", "--device-modules", EMULATED_NPU_MODULE],
        env={"VTOOLS_EMU_NPU_NO_BF16": "1"},
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
        "ASCEND_RT_VISIBLE_DEVICES=",
        "TORCH_DEVICE_BACKEND_AUTOLOAD=",
        "tuning: none",
    ):
        assert expected in out, (expected, out)
    assert "unavailable" in out.split("dist_backend:")[1].splitlines()[0]  # no hccl in the emulation
