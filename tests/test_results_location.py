"""An unwritable results location is refused before any work, by every script that writes results."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_usage_error, run_script


@pytest.mark.parametrize(
    "script, flag, fragment",
    [("validate.py", "--results-file", "--results-file"), ("inference.py", "--results-dir", "cannot create folder")],
)
@pytest.mark.cpu_only(reason="input checks: the run stops with one line before any device work")
def test_unwritable_results_location(
    script: str, flag: str, fragment: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a_file"  # a file where a folder is needed
    blocker.write_text("x")
    proc = run_script(
        [script, str(custom_images), "--model", str(custom_model_dir), flag, str(blocker / "results.csv")]
    )
    assert_usage_error(proc, fragment)
    assert blocker.read_text() == "x"
