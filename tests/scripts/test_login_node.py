"""A login node: the real torch_npu 2.14.0 installed (on the path, as pip would leave it), no CANN.

There torch's backend autoload imports torch_npu inside ``import torch``, which fails on ``libhccl.so``: every
command must stop in one line that names the missing library and both ways out (load CANN, or turn the autoload
off), whatever ``--device`` says. With ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` torch imports, ``--device cpu`` runs,
and asking for the npu stops in one line naming the import error. This is the real wheel
(tests/npu_wheel.py), not a stand-in that raises the same words.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, assert_one_line_error, run_script

pytestmark = pytest.mark.cpu_only(reason="no npu can load here: the real torch_npu without CANN")

DATA = str(REPO / "data" / "fashion-mnist-mini")
COMMANDS = {
    "train.py": ["train.py", "-c", "configs/fashion_mnist_cpu.yaml", "--epochs", "1"],
    "validate.py": ["validate.py", f"{DATA}/val", "--model", "test_resnet"],
    "inference.py": ["inference.py", f"{DATA}/val", "--model", "test_resnet"],
    "vtools env": ["-m", "vtools", "env"],
}


def on_path(wheel: Path, **env: str) -> dict[str, str]:
    return {"PYTHONPATH": f"{wheel}:{REPO}", **env}


@pytest.mark.parametrize("device", ["cpu", "auto", "npu"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_stops_in_one_line(command: str, device: str, torch_npu_wheel: Path, tmp_path: Path) -> None:
    args = [*COMMANDS[command], "--device", device]
    if command == "train.py":
        args += ["--output", str(tmp_path)]
    proc = run_script(args, env=on_path(torch_npu_wheel))
    assert_one_line_error(proc, 2, "libhccl.so", "set_env.sh", "TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_without_the_autoload_cpu_runs_and_npu_stops_in_one_line(
    torch_npu_wheel: Path, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    env = on_path(torch_npu_wheel, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    validate = ["validate.py", str(custom_images), "--model", str(custom_model_dir)]
    results = tmp_path / "results.csv"
    proc = run_script([*validate, "--device", "cpu", "--results-file", str(results)], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results.read_text().count("\n") == 2  # a header and the model's row
    proc = run_script([*validate, "--device", "npu"], env=env)
    assert_one_line_error(proc, 2, "torch_npu is installed but failed to load", "libhccl.so", "set_env.sh")
    proc = run_script([*validate, "--device", "auto"], env=env)
    assert_one_line_error(proc, 2, "no usable npu although torch_npu is installed", "libhccl.so", "--device cpu")
    proc = run_script(COMMANDS["vtools env"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "torch_npu: 2.14.0 (installed, fails to import: ImportError: libhccl.so" in proc.stdout
