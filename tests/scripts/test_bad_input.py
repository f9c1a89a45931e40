"""Awkward input handled as a user needs it: checkpoints timm writes, odd images and file names, a full
disk, class folders matched to a model's names — most cases run as a user runs them, as a subprocess.

Bad input that ends in a one-line error and nothing more is a row of tests/scripts/test_one_line_errors.py;
here are the cases that check more than that line (a second run that succeeds, what is left on disk,
a warning before the error) or that must not fail at all.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from tests.conftest import REPO, assert_usage_error, run_script, write_model_folder

pytestmark = pytest.mark.cpu_only(reason="input checks: the run stops with one line before any device work")

DATA = REPO / "data" / "fashion-mnist-mini"


def test_numbers_people_write_in_yaml_are_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads 1e-3 as a string; a float option takes it as the number it is."""
    from vtools.cli import train_flags as train
    from vtools.cli.config import parse_with_config

    config = tmp_path / "run.yaml"
    config.write_text("lr: 1e-3\nwarmup-lr: 5E-6\n")
    args = parse_with_config(train.build_parser(), ["-c", str(config)])
    assert (args.lr, args.warmup_lr) == (1e-3, 5e-6)


def test_checkpoint_written_by_timms_checkpoint_saver_validates(tmp_path: Path) -> None:
    """timm's CheckpointSaver pickles its argparse.Namespace (and numpy scalars) into every checkpoint;
    those few harmless types are allowed, nothing else: weights_only loading stays on."""
    from timm.utils import CheckpointSaver

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    args = argparse.Namespace(model="test_resnet", lr=0.1, seed=42)
    saver = CheckpointSaver(
        model, optimizer, args=args, checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path), max_history=1
    )
    saver.save_checkpoint(epoch=0, metric=np.float64(12.5))
    checkpoint = next(tmp_path.glob("checkpoint-0.pth.tar"))
    proc = run_script(
        [
            "validate.py",
            str(DATA / "val"),
            "--model",
            "test_resnet",
            "--num-classes",
            "10",
            "--checkpoint",
            str(checkpoint),
            "--device",
            "cpu",
            "--results-file",
            str(tmp_path / "r.csv"),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "on 300 images" in proc.stdout


# ---------------------------------------------------------------- images that used to go wrong silently


def test_16_bit_images_are_scaled_and_float_images_refused(tmp_path: Path) -> None:
    from PIL import Image

    from vtools.data.decode import BadSample, open_image

    sixteen = tmp_path / "deep.png"
    Image.fromarray(np.array([[0, 32896, 65535]], dtype=np.uint16)).save(sixteen)
    assert np.asarray(open_image(sixteen, "L")).tolist() == [[0, 128, 255]]  # not clipped to 255
    floating = tmp_path / "float.tif"
    Image.fromarray(np.array([[0.25, 0.5]], dtype=np.float32)).save(floating)
    refused = open_image(floating, "RGB")
    assert isinstance(refused, BadSample) and "floating-point" in refused.reason


def test_decompression_bomb_is_a_bad_image_not_a_crash(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "val" / "bag"
    folder.mkdir(parents=True)
    shutil.copy(next((DATA / "val" / "bag").glob("*.png")), folder / "good.png")
    Image.new("1", (10_000, 10_000)).save(folder / "bomb.png")  # 100 M pixels: above PIL's limit
    model = write_model_folder(tmp_path / "model", 1, ["bag"])
    proc = run_script(["validate.py", str(tmp_path / "val"), "--model", str(model), "--device", "cpu"])
    assert_usage_error(proc, "bomb.png", "DecompressionBomb")
    proc = run_script(
        ["validate.py", str(tmp_path / "val"), "--model", str(model), "--device", "cpu", "--on-bad-image", "skip"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "on 1 images" in proc.stdout


def test_macos_resource_forks_are_not_images(tmp_path: Path) -> None:
    from vtools.data.readers.folder import find_images

    (tmp_path / "photo.png").write_bytes((next((DATA / "val" / "bag").glob("*.png"))).read_bytes())
    (tmp_path / "._photo.png").write_bytes(b"\x00\x05\x16\x07 resource fork")
    assert [p.name for p in find_images(str(tmp_path))] == ["photo.png"]


def test_a_validation_with_every_image_skipped_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "val" / "bag"
    folder.mkdir(parents=True)
    (folder / "broken.png").write_bytes(b"not a png")
    model = write_model_folder(tmp_path / "model", 1, ["bag"])
    proc = run_script(
        ["validate.py", str(tmp_path / "val"), "--model", str(model), "--device", "cpu", "--on-bad-image", "skip"]
    )
    lines = proc.stderr.strip().splitlines()  # the skip warning, then the error
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert lines[0].startswith("warning: skipped unreadable image") and len(lines) == 2
    assert "no image could be read (1 skipped)" in lines[1]


def test_results_files_follow_the_umask_and_odd_file_names(tmp_path: Path) -> None:
    import os

    import pandas as pd

    images = tmp_path / "imgs"
    images.mkdir()
    odd = os.fsencode(str(images)) + b"/caf\xe9.png"  # a Latin-1 name: not UTF-8
    with open(odd, "wb") as handle:
        handle.write(next((DATA / "val" / "bag").glob("*.png")).read_bytes())
    model = write_model_folder(tmp_path / "model", 2, ["bag", "coat"])
    proc = run_script(
        [
            "inference.py",
            str(images),
            "--model",
            str(model),
            "--device",
            "cpu",
            "--results-dir",
            str(tmp_path / "out"),
            "--topk",
            "1",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "out" / f"{tmp_path.name}-topk1.csv"  # a folder called model/: its parent's name
    assert pd.read_csv(written)["filename"].tolist() == ["caf\\udce9.png"]
    assert written.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    import os

    current = os.umask(0)
    os.umask(current)
    return current


# ---------------------------------------------------------------- a full disk


def _file_size_limit(limit: int):
    """preexec_fn: files may grow to ``limit`` bytes, and past it a write fails (EFBIG) instead of the
    process being killed — what a full disk or a quota looks like to the program."""

    def apply() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _run_limited(args: list[str], limit: int) -> object:
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_file_size_limit(limit),
    )


def test_full_disk_while_writing_results_keeps_them_on_the_console(tmp_path: Path) -> None:
    from tests.conftest import assert_one_line_error

    results = tmp_path / "results.csv"
    results.write_text("an earlier run's results\n")
    model = write_model_folder(tmp_path / "m", 10)
    proc = _run_limited(
        [
            "validate.py",
            str(DATA / "val"),
            "--model",
            str(model),
            "--device",
            "cpu",
            "--workers",
            "0",
            "--results-file",
            str(results),
        ],
        limit=60,
    )
    assert_one_line_error(proc, 3, f"could not write {results}", "the previous version is intact")
    assert "Acc@1" in proc.stdout and "top1" in proc.stdout  # the numbers were printed before the write
    assert results.read_text() == "an earlier run's results\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_full_disk_while_saving_a_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    from tests.conftest import assert_one_line_error

    args = [
        "train.py",
        "--data-dir",
        str(DATA),
        "--model",
        "test_resnet",
        "--device",
        "cpu",
        "--workers",
        "0",
        "--img-size",
        "28",
        "--output",
        str(tmp_path),
        "--experiment",
        "run",
        "--batch-size",
        "200",
    ]
    assert run_script([*args, "--epochs", "1"]).returncode == 0
    last = tmp_path / "run" / "last.pth.tar"
    before = last.read_bytes()
    proc = _run_limited([*args, "--epochs", "2", "--resume", "auto"], limit=len(before) // 2)
    assert_one_line_error(proc, 3, "could not write", "the previous version is intact")
    assert last.read_bytes() == before
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == 1


# ---------------------------------------------------------------- which label each folder gets


def _class_folders(root: Path, names: list[str]) -> Path:
    for i, name in enumerate(names):
        (root / name).mkdir(parents=True)
        source = sorted((DATA / "val" / "bag").glob("*.png"))[i]
        (root / name / source.name).write_bytes(source.read_bytes())
    return root


def test_class_folders_match_model_names_ignoring_case(tmp_path: Path) -> None:
    model = write_model_folder(tmp_path / "model", 3, ["cat", "dog", "fox"])
    data = _class_folders(tmp_path / "val", ["Cat", "DOG", "fox"])
    proc = run_script(["validate.py", str(data), "--model", str(model), "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    assert "labels matched to the model's class names" in proc.stdout


def test_a_partial_class_match_is_refused_unless_a_class_map_says_how(tmp_path: Path) -> None:
    model = write_model_folder(tmp_path / "model", 3, ["cat", "dog", "fox"])
    data = _class_folders(tmp_path / "val", ["cat", "wolf"])
    assert_usage_error(
        run_script(["validate.py", str(data), "--model", str(model), "--device", "cpu"]),
        "1 of 2 class folders (wolf) are not among the model's class names",
        "--class-map",
    )
    class_map = tmp_path / "map.txt"
    class_map.write_text("cat\nwolf\nfox\n")
    proc = run_script(
        ["validate.py", str(data), "--model", str(model), "--device", "cpu", "--class-map", str(class_map)]
    )
    assert proc.returncode == 0, proc.stderr
    assert f"labels from --class-map {class_map}" in proc.stdout
