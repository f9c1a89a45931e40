"""Every shipped config is valid for train.py: known keys, right types, a model timm knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import CLASSES, REPO, device_flags, run_script, write_model_folder

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def quick_start_model_folders() -> set[str]:
    """The model folders that shipped from-scratch configs produce (``<output>/<experiment>/model``): a
    fine-tuning config may start from one of them."""
    from vtools.cli.config import read_yaml

    made = set()
    for path in CONFIGS:
        values = read_yaml(path)
        if values.get("output") and values.get("experiment"):
            made.add(f"{values['output']}/{values['experiment']}/model")
    return made


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_valid(path: Path) -> None:
    from vtools.cli.config import read_yaml, yaml_defaults
    from vtools.commands import train

    parser = train.build_parser()
    values = yaml_defaults(parser, read_yaml(path), str(path))
    assert timm.is_model(values["model"]) or values["model"] in quick_start_model_folders(), values["model"]
    assert values["epochs"] > 0 and values["batch_size"] > 0
    parser.set_defaults(**values)
    args = parser.parse_args([])
    assert args.model == values["model"]
    text = path.read_text()
    assert text.startswith("#"), "each config starts with a comment naming its source"


def test_the_fine_tuning_config_starts_from_a_model_folder_and_fits_its_warm_up(
    device: torch.device, fashion4: Path, tmp_path: Path
) -> None:
    """The shipped fine-tuning recipe on one's own classes: a 10-class model folder fine-tuned on a 4-class
    folder replaces the classifier, keeps the rest of the weights, and ends with a model folder that names
    the new classes; its warm-up fits inside its epochs."""
    from vtools.cli.config import read_yaml

    recipe = read_yaml(REPO / "configs/fashion_mnist_finetune_cpu.yaml")
    assert recipe["pretrained"] is True and recipe["warmup-epochs"] < recipe["epochs"]
    folder = write_model_folder(tmp_path / "pretrained", 10, [f"class{i}" for i in range(10)])
    proc = run_script(
        ["train.py", "-c", "configs/fashion_mnist_finetune_cpu.yaml", "--data-dir", str(fashion4)]
        + ["--model", str(folder), "--epochs", "2", "--output", str(tmp_path / "runs"), "--workers", "1"]
        + device_flags(device.type)
    )
    assert proc.returncode == 0, proc.stderr
    assert f"weights from {folder}, classifier re-initialised (10 -> 4 classes)" in proc.stdout
    config = json.loads((tmp_path / "runs/fashion-mnist-finetune-cpu/model/config.json").read_text())
    assert config["num_classes"] == 4 and config["label_names"] == CLASSES
