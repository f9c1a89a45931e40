"""validate.py end to end, as subprocesses, on cpu and the emulated npu (and cuda when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision

from tests.conftest import (
    DEVICE_TYPES,
    REPO,
    SECOND_DEVICES,
    SYNSETS,
    assert_usage_error,
    device_flags,
    run_script,
    write_model_folder,
)


def reference_metrics(model_dir: Path, image_root: Path, label_of: dict[str, int]) -> dict[str, float]:
    """top1/top5/loss with timm + torchvision alone (no vtools), all images in one batch."""
    model = timm.create_model(f"local-dir:{model_dir}", pretrained=True).eval()
    config = timm.data.resolve_data_config(model=model)
    dataset = torchvision.datasets.ImageFolder(str(image_root), transform=timm.data.create_transform(**config))
    images = torch.stack([image for image, _ in dataset])
    targets = torch.tensor([label_of[dataset.classes[t]] for _, t in dataset])
    with torch.no_grad():
        logits = model(images)
    top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
    return {
        "top1": 100 * (top5[:, 0] == targets).float().mean().item(),
        "top5": 100 * (top5 == targets[:, None]).any(dim=1).float().mean().item(),
        "loss": F.cross_entropy(logits, targets).item(),
        "samples": len(targets),
    }


def run_validate(args: list[str], results: Path, env: dict | None = None) -> dict:
    proc = run_script(["validate.py", *args, "--results-file", str(results), "--results-format", "json"], env=env)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(results.read_text())
    assert len(rows) == 1
    return rows[0]


def test_numbers_equal_reference_on_every_device(synset_images: Path, imagenet_model_dir: Path, tmp_path: Path) -> None:
    """Synset folders map to ImageNet indices; every device gives timm's numbers."""
    label_of = {name: timm.data.ImageNetInfo().label_names().index(name) for name in SYNSETS}
    expected = reference_metrics(imagenet_model_dir, synset_images, label_of)
    for device_type in DEVICE_TYPES + SECOND_DEVICES:
        row = run_validate(
            [str(synset_images), *device_flags(device_type), "--model", str(imagenet_model_dir), "--batch-size", "64"],
            tmp_path / f"{device_type}.json",
        )
        assert row["samples"] == expected["samples"] == 12
        assert row["top1"] == pytest.approx(expected["top1"], abs=1e-3), device_type
        assert row["top5"] == pytest.approx(expected["top5"], abs=1e-3), device_type
        assert row["loss"] == pytest.approx(expected["loss"], rel=1e-4), device_type
        assert row["top1_err"] == pytest.approx(100 - row["top1"])
        for key in (
            "model",
            "param_count",
            "img_size",
            "crop_pct",
            "interpolation",
            "device",
            "amp_dtype",
            "img_per_sec",
        ):
            assert key in row
        assert row["device"].startswith(device_type)


@pytest.mark.cpu_only(reason="class mapping is host-side; npu numbers: test_numbers_equal_reference_on_every_device")
def test_label_subset_and_folder_model_names(custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    """A model that stores class names maps folders by name, even for a subset of its classes."""
    subset = tmp_path / "subset"
    subset.mkdir()
    (subset / "fox").symlink_to(custom_images / "fox", target_is_directory=True)
    expected = reference_metrics(custom_model_dir, subset, {"fox": 2})
    row = run_validate([str(subset), "--device", "cpu", "--model", str(custom_model_dir)], tmp_path / "r.json")
    assert row["samples"] == 4 and row["top1"] == pytest.approx(expected["top1"], abs=1e-3)


@pytest.mark.cpu_only(reason="class mapping is host-side")
def test_class_map_file(custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    class_map = tmp_path / "map.txt"
    class_map.write_text("fox\ndog\ncat\n")  # reversed order: labels change, so do the numbers
    expected = reference_metrics(custom_model_dir, custom_images, {"fox": 0, "dog": 1, "cat": 2})
    row = run_validate(
        [str(custom_images), "--device", "cpu", "--model", str(custom_model_dir), "--class-map", str(class_map)],
        tmp_path / "r.json",
    )
    assert row["top1"] == pytest.approx(expected["top1"], abs=1e-3)
    assert row["loss"] == pytest.approx(expected["loss"], rel=1e-4)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_several_checkpoints_one_row_each_csv(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    import pandas as pd
    from safetensors.torch import load_file

    state = load_file(str(custom_model_dir / "model.safetensors"))
    checkpoints = tmp_path / "ckpts"
    checkpoints.mkdir()
    torch.save({"state_dict": state, "epoch": 3}, checkpoints / "a.pth.tar")
    zeroed = {k: torch.zeros_like(v) for k, v in state.items()}
    torch.save({"state_dict": zeroed, "state_dict_ema": state}, checkpoints / "b.pth.tar")
    results = tmp_path / "results.csv"
    proc = run_script(
        [
            "validate.py",
            str(custom_images),
            *device_flags(device_type),
            "--model",
            "test_resnet",
            "--num-classes",
            "3",
            "--checkpoint",
            str(checkpoints),
            "--results-file",
            str(results),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(results)
    assert [Path(p).name for p in table["checkpoint"]] == ["a.pth.tar", "b.pth.tar"]
    assert table["samples"].tolist() == [12, 12]
    assert table["loss"][0] != table["loss"][1]  # b's state_dict is all zeros
    ema = run_validate(
        [
            str(custom_images),
            *device_flags(device_type),
            "--model",
            "test_resnet",
            "--num-classes",
            "3",
            "--checkpoint",
            str(checkpoints / "b.pth.tar"),
            "--use-ema",
        ],
        tmp_path / "ema.json",
    )
    assert ema["loss"] == pytest.approx(table["loss"][0])  # b's EMA weights are a's weights


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_several_models_in_one_run(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    other = write_model_folder(tmp_path / "other", 3, ["cat", "dog", "fox"], seed=7)
    results = tmp_path / "r.json"
    proc = run_script(
        [
            "validate.py",
            str(custom_images),
            *device_flags(device_type),
            "--model",
            f"{custom_model_dir},{other}",
            "--results-file",
            str(results),
            "--results-format",
            "json",
            "--report",
            str(tmp_path / "reports"),
            "--report-worst",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(results.read_text())
    assert [row["model"] for row in rows] == [str(custom_model_dir), str(other)]
    import pandas as pd

    names = (custom_model_dir.parent.name, "other")  # a folder called model/ is named after the folder holding it
    for row, name in zip(rows, names):  # one class report per model, named after it
        folder = tmp_path / "reports" / name
        overall = pd.read_csv(folder / "overall.csv").iloc[0]
        assert overall["model"] == row["model"] and overall["top1"] == pytest.approx(row["top1"], abs=1e-4)
        per_class = pd.read_csv(folder / "per_class.csv")
        assert per_class["class"].tolist() == ["cat", "dog", "fox"] and per_class["support"].tolist() == [4, 4, 4]
        assert per_class["correct"].sum() == round(row["top1"] * 12 / 100)
        mistakes = pd.read_csv(folder / "misclassified.csv")
        assert len(mistakes) == min(2, 12 - per_class["correct"].sum())
        assert all(Path(sample).is_file() for sample in mistakes["sample"])
        assert (folder / "confusion.png").stat().st_size > 0 and (folder / "reliability.png").stat().st_size > 0


def _fashion_mnist_raw(root: Path) -> None:
    """torchvision's FashionMNIST raw files, written from the shipped PNG subset (offline)."""
    import numpy as np
    from PIL import Image

    classes = sorted(p.name for p in (REPO / "data/fashion-mnist-mini/val").iterdir())
    order = ["t-shirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle_boot"]
    images, labels = [], []
    for name in classes:
        for file in sorted((REPO / "data/fashion-mnist-mini/val" / name).glob("*.png"))[:2]:
            images.append(np.asarray(Image.open(file)))
            labels.append(order.index(name))
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    stack = np.stack(images).astype(np.uint8)
    for prefix in ("train", "t10k"):
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            b"\x00\x00\x08\x03" + np.array(stack.shape, dtype=">i4").tobytes() + stack.tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            b"\x00\x00\x08\x01" + np.array([len(labels)], dtype=">i4").tobytes() + np.array(labels, np.uint8).tobytes()
        )


@pytest.mark.cpu_only(reason="the data source is host-side")
def test_torchvision_dataset(tmp_path: Path) -> None:
    _fashion_mnist_raw(tmp_path / "fm")
    model_dir = write_model_folder(tmp_path / "model", 10)
    row = run_validate(
        [
            "--dataset",
            "torch/fashion_mnist",
            "--data-dir",
            str(tmp_path / "fm"),
            "--device",
            "cpu",
            "--model",
            str(model_dir),
        ],
        tmp_path / "r.json",
    )
    assert row["samples"] == 20


# ---------------------------------------------------------------- a corrupt image: one line, or skipped
# (one line and no results file; the other bad input, one line each: tests/scripts/test_one_line_errors.py)


def _with_corrupt_image(custom_images: Path, tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    good = root / "dog" / "dog_0.jpg"
    (root / "dog" / "truncated.jpg").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 3])
    (root / "cat" / "garbage.png").write_bytes(b"definitely not a png")
    return root


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_corrupt_image_error_and_skip(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    root = _with_corrupt_image(custom_images, tmp_path)
    results = tmp_path / "out" / "results.csv"
    proc = run_script(
        ["validate.py", str(root), *device_flags(device_type), "--model", str(custom_model_dir)]
        + ["--results-file", str(results)]
    )
    assert_usage_error(proc, "cannot read image", "--on-bad-image skip")
    assert not results.exists()
    row = run_validate(
        [str(root), *device_flags(device_type), "--model", str(custom_model_dir), "--on-bad-image", "skip"],
        tmp_path / "skip.json",
    )
    assert row["samples"] == 12 and row["skipped"] == 2


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_torchcompile_channels_last_same_numbers(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    plain = run_validate(
        [str(custom_images), *device_flags(device_type), "--model", str(custom_model_dir)], tmp_path / "a.json"
    )
    tuned = run_validate(
        [
            str(custom_images),
            *device_flags(device_type),
            "--model",
            str(custom_model_dir),
            "--torchcompile",
            "eager",
            "--channels-last",
        ],
        tmp_path / "b.json",
    )
    assert tuned["top1"] == plain["top1"] and tuned["loss"] == pytest.approx(plain["loss"], rel=1e-4)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_preprocessing_and_model_flags(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    row = run_validate(
        [
            str(custom_images),
            *device_flags(device_type),
            "--model",
            str(custom_model_dir),
            "--img-size",
            "48",
            "--crop-pct",
            "0.8",
            "--interpolation",
            "bicubic",
            "--crop-mode",
            "squash",
            "--mean",
            "0.5",
            "0.5",
            "0.5",
            "--std",
            "0.25",
            "0.25",
            "0.25",
            "--model-kwargs",
            "drop_rate=0.1",
            "--workers",
            "0",
            "--log-freq",
            "1",
            "--batch-size",
            "5",
        ],
        tmp_path / "a.json",
    )
    assert (row["img_size"], row["crop_pct"], row["interpolation"], row["samples"]) == (48, 0.8, "bicubic", 12)
    gray = run_validate(
        [
            str(custom_images),
            *device_flags(device_type),
            "--model",
            str(custom_model_dir),
            "--in-chans",
            "1",
            "--input-size",
            "1",
            "40",
            "40",
        ],
        tmp_path / "b.json",
    )
    assert gray["img_size"] == 40 and gray["samples"] == 12


def test_model_folder_weights_load_straight_onto_device(device: torch.device, custom_model_dir: Path) -> None:
    from safetensors.torch import load_file

    from vtools.models.create import create_model

    model = create_model(str(custom_model_dir), pretrained=True, device=device)
    saved = load_file(str(custom_model_dir / "model.safetensors"))
    for key, value in model.state_dict().items():
        assert value.device == device, key
        assert torch.equal(value.cpu(), saved[key]), key
    assert model.pretrained_cfg["label_names"] == ["cat", "dog", "fox"]
    adapted = create_model(str(custom_model_dir), pretrained=True, num_classes=5, device=device)
    assert adapted.num_classes == 5  # timm re-heads it; the backbone keeps the folder's weights
    assert torch.equal(adapted.state_dict()["conv1.0.weight"].cpu(), saved["conv1.0.weight"])
