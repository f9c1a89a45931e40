"""The two Ascend command lines of the README, character for character, on the emulated npu.

The emulator is loaded the way torch_npu is, by torch's ``torch.backends`` entry-point autoload
(tests/emulated_npu/autoload), so the lines need no ``--device-modules``. They run from a folder
laid out as the user's: ``./model_ckpts/tiny_vit_21m_512`` (a random-init model folder of that
very model), ``../ImageNet-1000/val/`` with synset class folders, and a flat ``./data/``. The npu
results must equal the cpu results of the same lines.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SYNSETS, autoload_env, write_image_set, write_model_folder

VALIDATE_LINE = (
    "python validate.py ../ImageNet-1000/val/ --device npu --model ./model_ckpts/tiny_vit_21m_512 "
    "--batch-size 64 --pretrained"
)
INFERENCE_LINE = (
    "python inference.py ./data/ --device npu --batch-size 64 --model ./model_ckpts/tiny_vit_21m_512 "
    "--label-type detail --topk 5"
)


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ascend_user")
    work = root / "work"
    write_image_set(root / "ImageNet-1000" / "val", SYNSETS, per_class=1, seed=3)
    data = work / "data"
    data.mkdir(parents=True)
    for i, image in enumerate(sorted((root / "ImageNet-1000" / "val").rglob("*.*"))):
        (data / f"photo_{i}{image.suffix}").write_bytes(image.read_bytes())
    write_model_folder(work / "model_ckpts" / "tiny_vit_21m_512", 1000, model_name="tiny_vit_21m_512")
    for script in ("validate.py", "inference.py"):
        (work / script).symlink_to(REPO / script)
    return work


def run_line(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """The line as a shell would split it; ``python`` is this interpreter (the one with torch)."""
    argv = shlex.split(line)
    assert argv[0] == "python"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, *argv[1:]], cwd=cwd, env={**env, **autoload_env()}, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_readme_shows_the_tested_lines() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert VALIDATE_LINE in readme and INFERENCE_LINE in readme


def test_validate_line_verbatim_equals_cpu(user_folder: Path) -> None:
    accuracy = re.compile(r"Acc@1 ([\d.]+) \([\d.]+\) Acc@5 ([\d.]+) \([\d.]+\) loss ([\d.]+) on (\d+) images")
    npu_run = run_line(VALIDATE_LINE, user_folder)
    assert " npu:0 " in npu_run.stdout  # the results table names the device that ran
    npu = accuracy.search(npu_run.stdout)
    cpu = accuracy.search(run_line(VALIDATE_LINE.replace("--device npu", "--device cpu"), user_folder).stdout)
    assert npu and cpu
    assert npu.group(4) == "3"
    assert npu.group(1, 2) == cpu.group(1, 2)  # top-1, top-5
    assert float(npu.group(3)) == pytest.approx(float(cpu.group(3)), rel=1e-3)


def _predictions(line: str, cwd: Path) -> list[dict[str, str]]:
    proc = run_line(line, cwd)
    results = cwd / "tiny_vit_21m_512-topk5.csv"
    assert f"results written to {results.name}" in proc.stdout
    with results.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_inference_line_verbatim_equals_cpu(user_folder: Path) -> None:
    npu = _predictions(INFERENCE_LINE, user_folder)
    cpu = _predictions(INFERENCE_LINE.replace("--device npu", "--device cpu"), user_folder)
    assert [row["filename"] for row in npu] == [f"photo_{i}.{ext}" for i, ext in enumerate(("jpg",) * 3)]
    for ours, theirs in zip(npu, cpu):
        labels = [ours[f"label_{k}"] for k in range(1, 6)]
        assert all(": " in label for label in labels)  # detail: "name: gloss"
        assert labels == [theirs[f"label_{k}"] for k in range(1, 6)]
        probs = [float(ours[f"prob_{k}"]) for k in range(1, 6)]
        assert probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1
        assert probs == pytest.approx([float(theirs[f"prob_{k}"]) for k in range(1, 6)], abs=1e-4)
