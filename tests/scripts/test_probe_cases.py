"""The adversarial probe's cases as a committed table (tests/scripts/probe_cases/*.yaml): each a command, what
it is given, the exit code and the first words, so the next round starts from what this one found."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, assert_one_line_error, run_script

TABLES = REPO / "tests" / "scripts" / "probe_cases"
DATA = REPO / "data" / "fashion-mnist-mini"
KEYS = {"id", "args", "exit", "first_words", "setup", "absent", "unchanged", "check", "slow"}


def _cases() -> list[Any]:
    cases = []
    for table in sorted(TABLES.glob("*.yaml")):
        for case in yaml.safe_load(table.read_text()) or []:
            marks = [pytest.mark.slow] if case.get("slow") else []
            cases.append(pytest.param(table.stem, case, id=f"{table.stem}:{case['id']}", marks=marks))
    return cases


CASES = _cases()


def _fill(text: str, tmp: Path) -> str:
    return text.format(tmp=tmp, data=DATA, repo=REPO)


def _area_function(area: str, name: str):
    return getattr(importlib.import_module(f"tests.scripts.probe_cases.{area}"), name)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


def test_every_case_is_well_formed_and_named_once() -> None:
    ids = [param.values[1]["id"] for param in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for param in CASES:
        area, case = param.values
        assert {"id", "args", "exit", "first_words"} <= set(case) <= KEYS, case
        for hook in ("setup", "check"):
            if hook in case:
                assert callable(_area_function(area, case[hook])), case


@pytest.mark.cpu_only("each case is a command line as the probe typed it, on the host's default device")
@pytest.mark.parametrize(("area", "case"), CASES)
def test_probe_case(area: str, case: dict, tmp_path: Path) -> None:
    if "setup" in case:
        _area_function(area, case["setup"])(tmp_path)
    watched = {name: _digest(tmp_path / name) for name in case.get("unchanged", [])}
    args = [_fill(arg, tmp_path) for arg in case["args"]]
    if args[0].endswith(".py"):
        args[0] = str(REPO / args[0])  # the scripts at the repository root, run from the test's own folder
    proc: subprocess.CompletedProcess = run_script(args, cwd=tmp_path)
    words = _fill(case["first_words"], tmp_path)
    if case["exit"] == 0:
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert words in proc.stdout + proc.stderr, (words, proc.stdout, proc.stderr)
    else:
        assert_one_line_error(proc, case["exit"], words)
    for name in case.get("absent", []):
        assert not (tmp_path / _fill(name, tmp_path)).exists(), name
    assert {name: _digest(tmp_path / name) for name in watched} == watched
    if "check" in case:
        _area_function(area, case["check"])(tmp_path, proc)
