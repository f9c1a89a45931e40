"""The README stays true: CI runs its test command verbatim, and the files it names exist."""

from __future__ import annotations

import re

from tests.conftest import REPO


def _quick_start_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.S)
    assert block, "README has a Quick start bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command() -> None:
    first, second = _quick_start_commands()[:2]
    assert "train.py -c configs/" in first
    ci_lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert second in ci_lines


def test_files_the_readme_names_exist() -> None:
    text = "".join((REPO / name).read_text(encoding="utf-8") for name in ("README.md", "vtools/commands/train.py"))
    named = set(re.findall(r"\b(configs/[\w.-]+\.yaml|requirements[\w-]*\.txt|tools/[\w.-]+\.py)", text))
    assert named, "the README names configs and requirement files"
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, missing
