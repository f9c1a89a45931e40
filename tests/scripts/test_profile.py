"""--profile N records N steps of each script's real loop: a trace file and the top-operator tables."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import (
    DEVICE_TYPES,
    REPO,
    device_flags,
    run_script,
    train_args,
    write_model_folder,
)

SHIPPED_VAL = REPO / "data" / "fashion-mnist-mini" / "val"


def _check_trace(trace: Path, stdout: str, device_type: str, steps: int) -> None:
    events = json.loads(trace.read_text())["traceEvents"]
    names = {event.get("name", "") for event in events}
    recorded = sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))
    assert len(recorded) == steps, recorded  # only the N steps after warm-up
    assert any(n.startswith("aten::") for n in names)
    assert "top operators by host time:" in stdout
    # the device's own activity comes from the device table: recorded for npu (PrivateUse1), not for cpu
    assert ("top operators by npu time:" in stdout) == (device_type == "npu")
    assert f"profile of {steps} steps after 2 warm-up: {trace}" in stdout


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_train_profile(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    proc = run_script(
        train_args(
            fashion4,
            tmp_path,
            "run",
            *device_flags(device_type),
            "--epochs",
            "1",
            "--batch-size",
            "16",
            "--profile",
            "3",
        )
    )
    assert proc.returncode == 0, proc.stderr
    _check_trace(tmp_path / "run" / "profile-train.pt.trace.json", proc.stdout, device_type, 3)


@pytest.fixture(scope="module")
def shipped_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    classes = sorted(p.name for p in SHIPPED_VAL.iterdir())
    return write_model_folder(tmp_path_factory.mktemp("profile") / "model", len(classes), classes)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_validate_and_inference_profile(device_type: str, shipped_model: Path, tmp_path: Path) -> None:
    common = [
        str(SHIPPED_VAL),
        "--model",
        str(shipped_model),
        *device_flags(device_type),
        "--batch-size",
        "32",
        "--profile",
        "2",
    ]
    validated = run_script(["validate.py", *common, "--results-file", str(tmp_path / "v" / "r.csv")])
    assert validated.returncode == 0, validated.stderr
    name = shipped_model.parent.name  # a folder called model/ is named after the folder holding it
    _check_trace(tmp_path / "v" / f"profile-validate-{name}.pt.trace.json", validated.stdout, device_type, 2)
    inferred = run_script(["inference.py", *common, "--results-dir", str(tmp_path / "i")])
    assert inferred.returncode == 0, inferred.stderr
    _check_trace(tmp_path / "i" / f"profile-inference-{name}.pt.trace.json", inferred.stdout, device_type, 2)


STAND_IN_PROFILER = """# Stand-in for torch_npu.profiler: its API (profile, schedule, ProfilerActivity.CPU/NPU,
# tensorboard_trace_handler writing a folder), implemented with torch.profiler.
import os
import torch.profiler as _torch_profiler

class ProfilerActivity:
    CPU = _torch_profiler.ProfilerActivity.CPU
    NPU = _torch_profiler.ProfilerActivity.PrivateUse1

schedule = _torch_profiler.schedule
profile = _torch_profiler.profile

def tensorboard_trace_handler(dir_name):
    def handle(prof):
        os.makedirs(dir_name, exist_ok=True)
        prof.export_chrome_trace(os.path.join(dir_name, "stand_in.pt.trace.json"))
    return handle
"""


@pytest.mark.npu_only(reason="the device table names torch_npu.profiler for npu only")
def test_npu_uses_the_backend_profiler_named_in_the_device_table(fashion4: Path, tmp_path: Path) -> None:
    """Where the backend brings its own profiler (torch_npu.profiler), the npu run uses it; a stand-in with
    its API shows which module ran and that the trace folder holds the profiled steps."""
    package = tmp_path / "stand_in" / "torch_npu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "profiler.py").write_text(STAND_IN_PROFILER)
    proc = run_script(
        train_args(
            fashion4, tmp_path, "run", *device_flags("npu"), "--epochs", "1", "--batch-size", "16", "--profile", "3"
        ),
        env={"PYTHONPATH": f"{tmp_path / 'stand_in'}{os.pathsep}{REPO}"},
    )
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "run" / "profile-train"
    assert f"profile of 3 steps after 2 warm-up by torch_npu.profiler: {folder}" in proc.stdout
    events = json.loads((folder / "stand_in.pt.trace.json").read_text())["traceEvents"]
    assert len({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}) == 3
