"""The one-code-path rule, enforced: device names appear only in vtools' device modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

DEVICE_SPECIFIC = re.compile(r"torch\.(cuda|npu)\b|torch_npu")


def _allowed(relative: str) -> bool:
    return relative.startswith("tests/") or re.fullmatch(r"vtools/runtime/device[^/]*\.py", relative) is not None


def test_no_device_specific_names_outside_device_module() -> None:
    offenders = []
    for path in sorted(REPO.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith((".", "mutants/")) or _allowed(relative):  # mutants/: mutmut's copy of the tree
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DEVICE_SPECIFIC.search(line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "device-specific names outside vtools/runtime/device*.py:\n" + "\n".join(offenders)


def test_the_rule_catches_a_leak(tmp_path) -> None:
    """The pattern itself must match the spellings it is meant to forbid."""
    for leak in ("torch.cuda.synchronize()", "import torch_npu", "torch.npu.set_device(0)"):
        assert DEVICE_SPECIFIC.search(leak)
    assert not DEVICE_SPECIFIC.search("torch.accelerator.synchronize()")
    assert (
        not _allowed("vtools/evaluation/loops.py") and _allowed("vtools/runtime/device.py") and _allowed("tests/x.py")
    )


@pytest.mark.cpu_only(reason="checks imports; runs nothing on a device")
def test_importing_vtools_never_imports_torch_npu() -> None:
    from tests.conftest import run_script

    probe = (
        "import sys, vtools, vtools.runtime.device, vtools.runtime.amp, vtools.cli; print('torch_npu' in sys.modules)"
    )
    proc = run_script(["-c", probe], env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ---------------------------------------------------------------- every device-facing test covers every device

DEVICE_ENTRY_POINTS = {"run_script", "main", "resolve_device", "train_one_epoch", "evaluate", "predict"}
COVERAGE_MARKERS = {"cpu_only", "npu_only"}


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _markers(decorators: list[ast.expr]) -> set[str]:
    """Names of pytest.mark.X(...) decorators that carry a reason."""
    found = set()
    for decorator in decorators:
        if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute):
            if decorator.func.attr in COVERAGE_MARKERS and (decorator.args or decorator.keywords):
                found.add(decorator.func.attr)
    return found


def _module_markers(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return _markers(values)
    return set()


def uncovered_device_tests(root: Path) -> list[str]:
    """Tests that run something on a device (a script, the training or evaluation loop, device resolution,
    directly or through a helper of their module) yet run on one device type only, without a
    cpu_only/npu_only marker saying why."""
    offenders = []
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        device_facing = set(DEVICE_ENTRY_POINTS)
        changed = True
        while changed:  # helpers that reach a device, transitively
            changed = False
            for name, function in functions.items():
                if (
                    not name.startswith("test_")
                    and name not in device_facing
                    and _called_names(function) & device_facing
                ):
                    device_facing.add(name)
                    changed = True
        module_markers = _module_markers(tree)
        for name, function in functions.items():
            if not name.startswith("test_") or not _called_names(function) & device_facing:
                continue
            parameters = {arg.arg for arg in function.args.args}
            covers_all = bool(parameters & {"device", "device_type", "chip_device"}) or "DEVICE_TYPES" in ast.unparse(
                function
            )
            if not (covers_all or _markers(function.decorator_list) or module_markers):
                offenders.append(f"{path.relative_to(root).as_posix()}::{name}")
    return offenders


def test_device_facing_tests_run_on_every_device() -> None:
    offenders = uncovered_device_tests(REPO / "tests")
    assert not offenders, (
        "device-facing tests that run on one device type without saying why "
        "(parametrize over DEVICE_TYPES, or mark cpu_only/npu_only with a reason):\n" + "\n".join(offenders)
    )


def test_the_coverage_rule_catches_a_cpu_only_test(tmp_path: Path) -> None:
    (tmp_path / "test_example.py").write_text(
        "import pytest\n"
        "def _train(x):\n    return run_script(['train.py', x])\n"
        "def test_silent():\n    _train('--device cpu')\n"
        "@pytest.mark.cpu_only(reason='input checks happen before any device work')\n"
        "def test_said():\n    _train('--device cpu')\n"
        "def test_param(device_type):\n    _train(device_type)\n"
        "def test_pure():\n    assert 1 + 1 == 2\n"
    )
    assert uncovered_device_tests(tmp_path) == ["test_example.py::test_silent"]
