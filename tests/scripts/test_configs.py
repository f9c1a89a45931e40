"""Every shipped config is valid for train.py (known keys, right types, a model timm knows) and trains its own
recipe on tiny data on every device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import CLASSES, REPO, device_flags, fashion_subset, run_script, write_model_folder

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
    from vtools.cli import train_flags as train
    from vtools.cli.config import read_yaml, yaml_defaults

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


# ---------------------------------------------------------------- every config trains as shipped, on tiny data

TINY_SIDE = 32
TINY_BATCH = 8  # even: mixup and CutMix pair the images of a batch
TINY_TRAIN = 8  # training images per class: an epoch is 4 steps
# What a run here changes of a config; everything else (model, optimizer, schedule, augmentation, mixup/CutMix,
# EMA, AMP, channels-last ...) is the shipped recipe, as the run's config.yaml shows.
TINY_KEYS = {"data-dir", "dataset", "img-size", "batch-size", "epochs", "workers", "output", "model", "model-kwargs"}


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TINY_TRAIN training and two validation images of each of four classes."""
    return fashion_subset(tmp_path_factory.mktemp("tiny"), TINY_TRAIN, 2)


def tiny_flags(values: dict, data: Path, out: Path) -> list[str]:
    """A config's run on ``data`` at TINY_SIDE pixels, TINY_BATCH images a step, one epoch, writing to ``out``."""
    flags = ["--data-dir", str(data), "--img-size", str(TINY_SIDE), "--batch-size", str(TINY_BATCH)]
    flags += ["--epochs", "1", "--workers", "1", "--output", str(out)]
    if values.get("dataset"):  # a torchvision dataset (downloaded): the folder instead
        flags += ["--dataset", ""]
    if values["model"] in quick_start_model_folders():  # the quick start's model folder, as a fine-tuning starts
        folder = write_model_folder(out / "start", 10, [f"class{i}" for i in range(10)])
        flags += ["--model", str(folder)]
    elif getattr(timm.models.get_pretrained_cfg(values["model"]), "fixed_input_size", False):
        # a ViT's patch grid is fixed when it is made; --img-size sizes the data only, as in timm's train.py
        flags += ["--model-kwargs", f"img_size={TINY_SIDE}"]
    return flags


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_trains_its_recipe_on_tiny_data(
    path: Path, device: torch.device, tiny_set: Path, tmp_path: Path
) -> None:
    """Each shipped config trains an epoch with its own recipe (augmentation, mixup/CutMix, EMA, schedule,
    AMP), with only the data, the sizes and the length changed: the run's options are the config's."""
    from vtools.cli.config import read_yaml

    values = read_yaml(path)
    flags = tiny_flags(values, tiny_set, tmp_path / "runs")
    proc = run_script(["train.py", "-c", str(path.relative_to(REPO)), *flags, *device_flags(device.type)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / values["experiment"]
    used = read_yaml(run / "config.yaml")
    changed = {key for key, value in values.items() if used[key.replace("-", "_")] != value} - TINY_KEYS
    assert not changed, {key: (values[key], used[key.replace("-", "_")]) for key in changed}
    steps = len(CLASSES) * TINY_TRAIN // TINY_BATCH
    assert f"step {steps}/{steps} " in proc.stdout


@pytest.mark.cpu_only(reason="the augmentation runs in the host's loader workers, the same for every device")
def test_the_deit_recipe_trains_200_steps_on_the_installed_pillow(tmp_path: Path) -> None:
    """DeiT's RandAugment (rand-m9-mstd0.5-inc1) asks for 0-bit posterize about once in 660 images; Pillow 13
    refuses it, which ended every ImageNet epoch. 200 steps of 6 over the shipped 1200 training images reach it
    about twice; the edge itself is pinned to Pillow 12's pixels in tests/data/test_augment_ops.py."""
    from vtools.cli.config import read_yaml

    path = REPO / "configs/deit_small_imagenet.yaml"
    values = read_yaml(path)
    flags = tiny_flags(values, REPO / "data/fashion-mnist-mini", tmp_path / "runs")
    flags[flags.index("--batch-size") + 1] = "6"
    flags += ["--log-interval", "50"]
    proc = run_script(["train.py", "-c", str(path.relative_to(REPO)), *flags, "--device", "cpu"], timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 200/200 " in proc.stdout


# ---------------------------------------------------------------- issue 33: what a run file's values become


def _parsed(tmp_path: Path, text: str, *argv: str):
    from vtools.cli import train_flags as train
    from vtools.cli.config import parse_with_config
    from vtools.cli.train_flags import check_train_args

    (tmp_path / "run.yaml").write_text(text, encoding="utf-8")
    args = parse_with_config(train.build_parser(), ["-c", str(tmp_path / "run.yaml"), *argv])
    check_train_args(args)
    return args


@pytest.mark.parametrize(
    "text, argv, folder",
    [
        ("data: /a\ndata_dir: /b\n", [], "/b"),  # timm's train.py: data_dir, and data only without it
        ("data_dir: /b\ndata: /a\n", [], "/b"),
        ("data: /a\n", [], "/a"),
        ("model: m\n", ["/a", "--data-dir", "/b"], "/b"),  # the same rule on the command line
        ("data-dir: /b\n", ["/c"], "/c"),  # the command line overrides the file, in either spelling
        ("data: /a\ndata_dir: /b\n", ["--data-dir", "/c"], "/c"),
        ("data-dir: /b\n", ["/c", "--data-dir", "/d"], "/d"),
    ],
)
def test_the_data_folder_is_timms_data_dir_and_flags_override_the_file(
    tmp_path: Path, text: str, argv: list[str], folder: str
) -> None:
    """A YAML with both ``data`` and ``data_dir`` trained on ``data``, where timm trains on ``data_dir``."""
    assert _parsed(tmp_path, text, *argv).data_dir == folder


def test_a_string_option_takes_the_text_written(tmp_path: Path) -> None:
    """YAML reads 2024-05-01 as a date (a traceback at the run folder), 1.10 as 1.1 and 0123 as 83; a name or
    path option takes what the user wrote, and number options still take numbers."""
    text = "data-dir: 0123\nexperiment: 2024-05-01\ninterpolation: bicubic\ndevice-modules: [2024-05-01, 1.10]\n"
    args = _parsed(tmp_path, text + "lr: 1e-3\nepochs: 2\n")
    assert (args.data_dir, args.experiment, args.device_modules) == ("0123", "2024-05-01", ["2024-05-01", "1.10"])
    assert (args.lr, args.epochs, args.interpolation) == (0.001, 2, "bicubic")
    assert _parsed(tmp_path, "data-dir: /d\nexperiment: 1.10\n").experiment == "1.10"
