"""Bad input is one line and exit code 2, no traceback, before any model is built — as a user meets it.

Each case runs the script as a subprocess. Model-creating cases use a model name that would need a
download, so a check that came after model creation would show up as a network error instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from tests.conftest import REPO, assert_usage_error, run_script

pytestmark = pytest.mark.cpu_only(reason="input checks: the run stops with one line before any device work")

DATA = REPO / "data" / "fashion-mnist-mini"
NEEDS_DOWNLOAD = ["--model", "resnet18.a1_in1k", "--pretrained"]


@pytest.mark.parametrize("flags, fragment", [
    (["--img-size", "0"], "--img-size must be a positive integer"),
    (["--input-size", "3", "0", "0"], "--input-size needs three positive numbers"),
    (["--workers", "-1"], "--workers must be 0"),
    (["--in-chans", "0"], "--in-chans must be a positive integer"),
    (["--mean", "0.5", "0.5"], "--mean needs one value per input channel"),
    (["--std", "0", "0", "0"], "--std must not be 0"),
    (["--batch-size", "nan"], "invalid int value"),
    (["--batchsize", "8"], "did you mean --batch-size?"),
])
@pytest.mark.parametrize("script", ["validate.py", "inference.py"])
def test_unusable_flag_values(script: str, flags: list[str], fragment: str) -> None:
    assert_usage_error(run_script([script, str(DATA / "val"), *NEEDS_DOWNLOAD, *flags], env={"HF_HUB_OFFLINE": "1"}),
                       fragment)


@pytest.mark.parametrize("flags, fragment", [
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--epochz", "3"], "did you mean --epochs?"),
    (["--val-interval", "0"], "--val-interval must be a positive integer"),
])
def test_unusable_training_flags(flags: list[str], fragment: str, tmp_path: Path) -> None:
    proc = run_script(["train.py", "--data-dir", str(DATA), *NEEDS_DOWNLOAD, "--output", str(tmp_path), *flags],
                      env={"HF_HUB_OFFLINE": "1"})
    assert_usage_error(proc, fragment)
    assert not any(tmp_path.iterdir())  # nothing half-made


@pytest.mark.parametrize("text, fragment", [
    ("batch-size: null\n", "key 'batch-size' expects an integer, got null"),
    ("epochs: null\n", "key 'epochs' expects an integer, got null"),
    ("model: null\n", "key 'model' expects a value, got null"),
    ("lr: 0.1\nlr: 0.2\n", "key 'lr' is given twice (line 3)"),  # line 1 is data-dir
])
def test_unusable_yaml(text: str, fragment: str, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"data-dir: {DATA}\n{text}")
    assert_usage_error(run_script(["train.py", "-c", str(config), "--output", str(tmp_path / "out")]), fragment)


def test_yaml_that_is_not_utf8_or_is_a_folder(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_bytes(b"lr: \xff\xfe\n")
    assert_usage_error(run_script(["train.py", "-c", str(config)]), "is not UTF-8 text")
    assert_usage_error(run_script(["train.py", "-c", str(tmp_path)]), "is a folder, not a YAML file")


def test_numbers_people_write_in_yaml_are_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads 1e-3 as a string; a float option takes it as the number it is."""
    from vtools.config import parse_with_config
    import train

    config = tmp_path / "run.yaml"
    config.write_text("lr: 1e-3\nwarmup-lr: 5E-6\n")
    args = parse_with_config(train.build_parser(), ["-c", str(config)])
    assert (args.lr, args.warmup_lr) == (1e-3, 5e-6)


def test_empty_checkpoints(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    proc = run_script(["validate.py", str(DATA / "val"), "--model", "test_resnet", "--num-classes", "10",
                       "--checkpoint", str(empty), "--device", "cpu"])
    assert_usage_error(proc, "is empty (0 bytes)")
    proc = run_script(["train.py", "--data-dir", str(DATA), "--model", "test_resnet", "--initial-checkpoint",
                       str(empty), "--device", "cpu", "--output", str(tmp_path / "out")])
    assert_usage_error(proc, "is empty (0 bytes)")


def test_model_folder_config_that_is_not_an_object(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("[1, 2]")
    proc = run_script(["validate.py", str(DATA / "val"), "--model", str(folder), "--device", "cpu"])
    assert_usage_error(proc, "config.json must hold an object")


def test_checkpoint_written_by_timms_checkpoint_saver_validates(tmp_path: Path) -> None:
    """timm's CheckpointSaver pickles its argparse.Namespace (and numpy scalars) into every checkpoint;
    those few harmless types are allowed, nothing else: weights_only loading stays on."""
    from timm.utils import CheckpointSaver

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    args = argparse.Namespace(model="test_resnet", lr=0.1, seed=42)
    saver = CheckpointSaver(model, optimizer, args=args, checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path),
                            max_history=1)
    saver.save_checkpoint(epoch=0, metric=np.float64(12.5))
    checkpoint = next(tmp_path.glob("checkpoint-0.pth.tar"))
    proc = run_script(["validate.py", str(DATA / "val"), "--model", "test_resnet", "--num-classes", "10",
                       "--checkpoint", str(checkpoint), "--device", "cpu", "--results-file",
                       str(tmp_path / "r.csv")])
    assert proc.returncode == 0, proc.stderr
    assert "on 300 images" in proc.stdout
