"""vtools installs like a library of the field: `pip install .` gives the package and a `vtools` command that
work from any folder, not only from the repository root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write_model_folder

pytestmark = pytest.mark.cpu_only(reason="packaging: installs and runs commands on the host")

SHIPPED_VAL = REPO / "data" / "fashion-mnist-mini" / "val"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment (seeing this machine's torch and timm) with vtools installed from a copy of the
    source, so the build leaves nothing in the repository."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    shutil.copytree(REPO / "vtools", source / "vtools", ignore=shutil.ignore_patterns("__pycache__"))
    requirements = ("requirements.txt", "requirements-hf.txt", "requirements-deploy.txt", "requirements-track.txt")
    for name in ("pyproject.toml", "README.md", *requirements):
        shutil.copy(REPO / name, source / name)
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env)], check=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return env


def _run(env: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the repository
    return subprocess.run(args, cwd=cwd, env=clean, capture_output=True, text=True, timeout=600)


def test_commands_work_from_any_folder(installed: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(
        installed, [str(installed / "bin" / "python"), "-c", "import vtools; print(vtools.__file__)"], elsewhere
    )
    assert str(installed) in where.stdout, where.stdout  # the installed copy, not the checkout
    for command in (
        [str(installed / "bin" / "vtools"), "env"],
        [str(installed / "bin" / "python"), "-m", "vtools", "env"],
    ):
        proc = _run(installed, command, elsewhere)
        assert proc.returncode == 0, proc.stderr
        assert "device: cpu" in proc.stdout and "torch: " in proc.stdout
    classes = sorted(p.name for p in SHIPPED_VAL.iterdir())
    model = write_model_folder(tmp_path / "model", len(classes), classes)
    results = elsewhere / "results.csv"
    validated = _run(
        installed,
        [
            str(installed / "bin" / "vtools"),
            "validate",
            str(SHIPPED_VAL),
            "--model",
            str(model),
            "--device",
            "cpu",
            "--results-file",
            str(results),
        ],
        elsewhere,
    )
    assert validated.returncode == 0, validated.stderr
    assert "on 300 images" in validated.stdout and results.is_file()


def test_usage_and_unknown_command(installed: Path, tmp_path: Path) -> None:
    usage = _run(installed, [str(installed / "bin" / "vtools"), "--help"], tmp_path)
    assert usage.returncode == 0
    for command in ("train", "validate", "infer", "env", "export", "shards", "plot", "benchmark", "bulk"):
        assert f"  {command} " in usage.stdout
    wrong = _run(installed, [str(installed / "bin" / "vtools"), "valdate"], tmp_path)
    assert wrong.returncode == 2 and "did you mean validate?" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
