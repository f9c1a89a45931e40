"""The one-code-path rule, enforced: device names appear only in vtools' device modules."""

from __future__ import annotations

import re

from tests.conftest import REPO

DEVICE_SPECIFIC = re.compile(r"torch\.(cuda|npu)\b|torch_npu")


def _allowed(relative: str) -> bool:
    return relative.startswith("tests/") or re.fullmatch(r"vtools/device[^/]*\.py", relative) is not None


def test_no_device_specific_names_outside_device_module() -> None:
    offenders = []
    for path in sorted(REPO.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(".") or _allowed(relative):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DEVICE_SPECIFIC.search(line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "device-specific names outside vtools/device*.py:\n" + "\n".join(offenders)


def test_the_rule_catches_a_leak(tmp_path) -> None:
    """The pattern itself must match the spellings it is meant to forbid."""
    for leak in ("torch.cuda.synchronize()", "import torch_npu", "torch.npu.set_device(0)"):
        assert DEVICE_SPECIFIC.search(leak)
    assert not DEVICE_SPECIFIC.search("torch.accelerator.synchronize()")
    assert not _allowed("vtools/engine.py") and _allowed("vtools/device.py") and _allowed("tests/x.py")


def test_importing_vtools_never_imports_torch_npu() -> None:
    from tests.conftest import run_script

    probe = "import sys, vtools, vtools.device, vtools.amp, vtools.cli; print('torch_npu' in sys.modules)"
    proc = run_script(["-c", probe], env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
